"""Config loading: typed values, overrides, and precise errors (exit code 2, nothing created)."""
from pathlib import Path

import pytest

from fastsac.config import ConfigError, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[3]


def test_defaults_are_reference_values():
    cfg = config_from_dict({})
    assert cfg.algo.batch_size == 8192 and cfg.algo.num_updates == 8 and cfg.algo.policy_frequency == 4
    assert (cfg.algo.num_atoms, cfg.algo.v_min, cfg.algo.v_max) == (101, -20.0, 20.0)
    assert (cfg.algo.gamma, cfg.algo.tau, cfg.algo.alpha_init) == (0.97, 0.125, 0.001)
    assert cfg.trainer.asynchronous is True
    ao = cfg.trainer.async_options
    assert ao.num_collectors == 1 and ao.numa_binding == "auto"  # binds only what is worth binding (placement)


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
    ({"algo": {"gamma": 1.5}}, [], "algo.gamma: 1.5 is out of range; expected a value >= 0.0 and <= 1.0"),
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
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


# --------------------------------------------------------------------------- strict YAML

ALIAS_BOMB = "".join(
    f"{k}: &{k} [{', '.join(['*' + p] * 9 if p else ['lol'] * 9)}]\n"
    for p, k in zip(["", "a", "b", "c", "d", "e", "f", "g", "h"], "abcdefghi"))


def _load_error(tmp_path, text: str) -> str:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    return str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("", "config file '{p}', line 1: no settings (the file is empty or only comments)"),
    ("# only a comment\n\n", "config file '{p}', line 1: no settings (the file is empty or only comments)"),
    ("seed: 1\nenv:\n  num_envs: 4\nseed: 2\n",
     "config file '{p}', line 4: duplicate key 'seed' (first at line 1); every key may appear once"),
    ("env:\n  num_envs: 4\n  name: pendulum\n  num_envs: 8\n",
     "config file '{p}', line 4: duplicate key 'env.num_envs' (first at line 2); every key may appear once"),
    ("a: &a [*a]\n", "config file '{p}', line 1: alias *a: YAML aliases are not allowed in a job config"),
    ("base: &b {num_envs: 4}\nenv:\n  <<: *b\n",
     "config file '{p}', line 3: alias *b: YAML aliases are not allowed in a job config"),
    (ALIAS_BOMB, "config file '{p}', line 2: alias *a: YAML aliases are not allowed in a job config"),
    ("seed: [1\n", "config file '{p}', line 2"),
    ("- 1\n- 2\n", "config file '{p}', line 1: expected a mapping of keys at the top, got list"),
])
def test_strict_yaml(tmp_path, text, expected):
    assert len(ALIAS_BOMB) < 500
    assert expected.format(p=tmp_path / "job.yaml") in _load_error(tmp_path, text)


def test_explicit_empty_mapping_is_all_defaults(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("{}\n")
    assert load_config(p) == config_from_dict({})


def test_overrides_are_strict_too():
    with pytest.raises(ConfigError, match="override trainer.async_options.numa_nodes: .*duplicate key|alias"):
        config_from_dict({}, ["trainer.async_options.numa_nodes=[*a]"])
    with pytest.raises(ConfigError, match="duplicate key 'num_envs'"):
        config_from_dict({}, ["env={num_envs: 4, num_envs: 8}"])


@pytest.mark.parametrize("name", ["name\n", "name\r\n", "a" * 32 + "\n"])
def test_job_name_is_matched_whole(name):
    with pytest.raises(ConfigError, match="job_name: .* cannot name a shared-memory segment"):
        config_from_dict({"job_name": name})


@pytest.mark.parametrize("key", ["device", "trainer.async_options.collector_inference_device"])
def test_device_is_matched_whole(key):
    with pytest.raises(ConfigError, match=f"{key}: 'cuda\\\\n' is not valid"):
        config_from_dict({}, [f'{key}="cuda\\n"'])


# --------------------------------------------------------------------------- ranges and contradictions

@pytest.mark.parametrize("data, overrides, expected", [
    ({"seed": 2**32}, [], "seed: 4294967296 is out of range; expected a value >= 0 and <= 4294967295"),
    ({"seed": -1}, [], "seed: -1 is out of range; expected a value >= 0 and <= 4294967295"),
    ({"seed": 3.0}, [], "seed: 3.0 is a float; expected an integer"),
    ({"env": {"num_envs": 2**63}}, [],
     "env.num_envs: 9223372036854775808 is out of range; expected a value >= 1 and <= 4294967296"),
    ({"trainer": {"num_iterations": 2**63}}, [],
     "trainer.num_iterations: 9223372036854775808 is out of range; expected a value >= 1 and <= 9223372036854775807"),
    ({"env": {"num_envs": 2**32}, "trainer": {"num_iterations": 2**40}}, [],
     "trainer.num_iterations: 1099511627776 iterations x env.num_envs 4294967296 = 4722366482869645213696 "
     "env steps do not fit the 64-bit step counters"),
    # every size has a bound far above any machine and far below an int64 overflow of their products
    ({"algo": {"batch_size": 2**62}}, [],
     "algo.batch_size: 4611686018427387904 is out of range; expected a value >= 1 and <= 16777216"),
    ({"algo": {"critic_hidden_dim": 2**20}}, [],
     "algo.critic_hidden_dim: 1048576 is out of range; expected a value >= 1 and <= 65536"),
    ({"algo": {"num_atoms": 2**20}}, [], "algo.num_atoms: 1048576 is out of range; expected a value >= 2 and <= 65536"),
    ({"algo": {"actor_num_layers": 65, "trunk_shape": "uniform"}}, [],
     "algo.actor_num_layers: 65 is out of range; expected a value >= 1 and <= 64"),
    ({"trainer": {"async_options": {"heartbeat_timeout_s": 1.9}}}, [],
     "trainer.async_options.heartbeat_timeout_s: 1.9 is out of range; expected a value >= 2.0"),
    ({"trainer": {"async_options": {"stop_timeout_s": 4}}}, [],
     "trainer.async_options.stop_timeout_s: 4.0 is out of range; expected a value >= 5.0"),
    ({"trainer": {"async_options": {"max_restarts": 1001}}}, [],
     "trainer.async_options.max_restarts: 1001 is out of range; expected a value >= 0 and <= 1000"),
    ({"trainer": {"async_options": {"numa_binding": "off", "numa_nodes": [0]}}}, [],
     "trainer.async_options.numa_nodes: [0] contradicts trainer.async_options.numa_binding: 'off' (nothing is "
     "bound with 'off'); remove numa_nodes, or set numa_binding to 'auto', 'numactl' or 'inprocess'"),
    ({"trainer": {"async_options": {"numa_binding": "off", "cpus_per_collector": 2}}}, [],
     "trainer.async_options.cpus_per_collector: 2 contradicts trainer.async_options.numa_binding: 'off'"),
    ({"trainer": {"async_options": {"numa_binding": "off", "learner_numa_node": 0}}}, [],
     "trainer.async_options.learner_numa_node: 0 contradicts trainer.async_options.numa_binding: 'off'"),
    ({"trainer": {"async_options": {"placement": "colocate"}}}, ["trainer.async_options.numa_binding=off"],
     "trainer.async_options.placement: 'colocate' contradicts trainer.async_options.numa_binding: 'off'"),
    ({"env": {"num_envs": 8}, "trainer": {"async_options": {"num_collectors": 2, "manual_collectors": [0, 0]}}}, [],
     "trainer.async_options.manual_collectors[1]: collector 0 is listed twice ([0, 0]); list each collector id once"),
])
def test_range_and_contradiction_errors(data, overrides, expected):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, overrides)
    assert expected in str(info.value)


def test_binding_default_is_auto_and_the_keys_need_no_second_switch():
    ao = config_from_dict({}).trainer.async_options
    assert ao.numa_binding == "auto"
    assert config_from_dict({}, ["trainer.async_options.numa_nodes=[0]"]).trainer.async_options.numa_nodes == [0]


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_names_its_job_after_its_file(path):
    cfg = load_config(path)        # every key valid, every value in range
    assert cfg.job_name == path.stem


@pytest.mark.parametrize("text, expected", [
    ("seed: 0100", "line 1: seed: 0100 is 64 in YAML 1.1 but 100 in YAML 1.2"),
    ("env:\n  num_envs: 020", "line 2: env.num_envs: 020 is 16 in YAML 1.1 but 20 in YAML 1.2"),
    ("seed: 1:20", "line 1: seed: 1:20 is 80 in YAML 1.1 but '1:20' in YAML 1.2"),
    ("seed: 1_000", "line 1: seed: 1_000 is 1000 in YAML 1.1 but '1_000' in YAML 1.2"),
    ("algo:\n  obs_normalization: off", "algo.obs_normalization: 'off' is a str; expected true or false (YAML 1.2"),
    ("algo:\n  autotune_alpha: yes", "algo.autotune_alpha: 'yes' is a str; expected true or false"),
    ("algo:\n  compile: on", "algo.compile: 'on' is a str; expected true or false"),
    ("algo:\n  amp: NO", "algo.amp: 'NO' is a str; expected true or false"),
])
def test_yaml_1_1_forms_are_refused_naming_the_key_and_the_value(tmp_path, text, expected):
    """The config is YAML 1.2 (core schema): PyYAML's YAML 1.1 octal, base-60, underscored numbers
    and on/off/yes/no booleans were read silently (seed: 0100 ran with seed 64)."""
    p = tmp_path / "c.yaml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert expected in str(exc.value), str(exc.value)
    # the same value as an override
    dotted = {"seed: 0100": "seed=0100", "seed: 1:20": "seed=1:20", "algo:\n  compile: on": "algo.compile=on"}
    if text in dotted:
        with pytest.raises(ConfigError):
            config_from_dict({}, [dotted[text]])


def test_yaml_1_2_spellings_still_read_as_before(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 100\ntrainer:\n  async_options:\n    numa_binding: off\nalgo:\n  compile: false\n"
                 "  gamma: .5\n  v_min: -1.\n  actor_lr: 3e-4\n")
    cfg = load_config(p)
    assert (cfg.seed, cfg.trainer.async_options.numa_binding, cfg.algo.compile, cfg.algo.gamma, cfg.algo.v_min,
            cfg.algo.actor_lr) == (100, "off", False, 0.5, -1.0, 3e-4)


@pytest.mark.parametrize("text, expected", [
    ('"": 3', "the config: the key '' is empty; valid keys in the config: job_name"),
    ('env:\n  "": 3', "env: the key '' is empty; valid keys in env: name"),
])
def test_an_empty_key_is_named_as_empty(tmp_path, text, expected):
    """It was reported as ': unknown key', naming nothing."""
    p = tmp_path / "c.yaml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert expected in str(exc.value), str(exc.value)
