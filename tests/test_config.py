"""Config loading: typed values, overrides, and precise errors (exit code 2, nothing created)."""
import subprocess
import sys
from pathlib import Path

import pytest

from fastsac.config import ConfigError, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults_are_reference_values():
    cfg = config_from_dict({})
    assert cfg.algo.batch_size == 8192 and cfg.algo.num_updates == 8 and cfg.algo.policy_frequency == 4
    assert (cfg.algo.num_atoms, cfg.algo.v_min, cfg.algo.v_max) == (101, -20.0, 20.0)
    assert (cfg.algo.gamma, cfg.algo.tau, cfg.algo.alpha_init) == (0.97, 0.125, 0.001)
    assert cfg.trainer.asynchronous is True
    ao = cfg.trainer.async_options
    assert ao.num_collectors == 1 and ao.numa_binding == "off"  # backward compatible default


def test_overrides_are_typed():
    cfg = config_from_dict({}, ["trainer.num_iterations=200", "seed=3", "algo.actor_lr=1e-3",
                                "trainer.async_options.numa_nodes=[0]", "trainer.asynchronous=false"])
    assert cfg.trainer.num_iterations == 200 and cfg.seed == 3
    assert cfg.algo.actor_lr == pytest.approx(1e-3)
    assert cfg.trainer.async_options.numa_nodes == [0]
    assert cfg.trainer.asynchronous is False


def test_yaml_bare_off_means_the_word_off(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  async_options:\n    numa_binding: off\n")
    assert load_config(p).trainer.async_options.numa_binding == "off"
    assert config_from_dict({}, ["trainer.async_options.numa_binding=off"]).trainer.async_options.numa_binding == "off"


def test_yaml_float_without_dot_is_accepted(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo:\n  critic_lr: 3e-4\n")
    assert load_config(p).algo.critic_lr == pytest.approx(3e-4)


@pytest.mark.parametrize("data, overrides, expected", [
    ({"algo": {"batch_sise": 5}}, [], "algo.batch_sise: unknown key; did you mean 'algo.batch_size'?"),
    ({}, ["trainer.num_iteration=5"], "did you mean 'trainer.num_iterations'"),
    ({"algo": {"batch_size": "big"}}, [], "algo.batch_size: 'big' is a str; expected an integer"),
    ({"algo": {"batch_size": 1.5}}, [], "algo.batch_size: 1.5 is a float; expected an integer"),
    ({"algo": {"gamma": 1.5}}, [], "algo.gamma: 1.5 is out of range; expected a value <= 1.0"),
    ({"algo": {"num_updates": -1}}, [], "algo.num_updates: -1 is out of range; expected a value >= 0"),
    ({"trainer": {"asynchronous": "yes"}}, [], "trainer.asynchronous: 'yes' is a str; expected true or false"),
    ({"trainer": {"async_options": {"utd_mode": "fast"}}}, [],
     "trainer.async_options.utd_mode: 'fast' is not valid; expected one of 'strict', 'learner_bound'"),
    ({"algo": {"v_min": 5.0, "v_max": 1.0}}, [], "algo.v_min: 5.0 must be below algo.v_max (1.0)"),
    ({"env": {"name": "pendulm"}}, [], "env.name: 'pendulm' is not a known env; did you mean 'pendulum'?"),
    ({"job_name": "a b"}, [], "job_name: 'a b' cannot name a shared-memory segment"),
    ({"device": "gpu"}, [], "device: 'gpu' is not valid; expected auto, cpu, cuda or cuda:N"),
    ({"env": {"num_envs": 1}, "trainer": {"async_options": {"num_collectors": 2}}}, [],
     "env.num_envs: 1 is fewer than trainer.async_options.num_collectors (2)"),
    ({"trainer": {"async_options": {"num_collectors": 2, "numa_nodes": [0]}}}, [],
     "trainer.async_options.numa_nodes: [0] has 1 entries but num_collectors is 2"),
    ({"algo": 3}, [], "algo: expected a mapping of keys, got int 3"),
    ({}, ["seed"], "override 'seed': expected key=value"),
    ({}, ["seed.x=1"], "seed: {'x': 1} is a dict; expected an integer"),
])
def test_errors_name_key_value_and_valid_range(data, overrides, expected):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, overrides)
    assert expected in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)


def test_cli_invalid_config_exits_2_and_creates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs/quickstart.yaml"),
                           f"run_dir={run_dir}", "algo.gama=0.9"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert "algo.gama: unknown key; did you mean 'algo.gamma'?" in proc.stderr
    assert not run_dir.exists() and list(tmp_path.iterdir()) == []


def test_cli_unwritable_run_dir_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs/quickstart.yaml"),
                           f"run_dir={blocker}/sub"], capture_output=True, text=True)
    assert proc.returncode == 2 and "run_dir" in proc.stderr and "not writable" in proc.stderr
