"""fastsac-eval through its CLI on checkpoints of tiny real pendulum runs (sync and async: the same
format): deterministic episodes on fresh envs, reproducible per seed, and exit 2 with a clear
message for a missing or corrupt checkpoint, an env of other dimensions and --video without its
file (the videos themselves: tests/process/tools/test_video_process.py); run_eval_episodes'
before_step hook sees every step of every counted episode and changes nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.checkpoint_bytes import flip_tensor_bytes
from support.cli_batch import run_mains
from support.e2e_helpers import launch, newest_checkpoint, tiny_config
from support.shm_jobs import new_job_name

PENDULUM_STEPS = 200          # the pendulum's default time limit, which tiny_config keeps
_LINE = re.compile(r"^(return|length): mean (\S+)\s+min (\S+)\s+max (\S+)$", re.M)


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastsac.tools.evaluate", *args], capture_output=True, text=True,
                          timeout=240)


def stats(out: str) -> dict[str, tuple[float, float, float]]:
    return {m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in _LINE.finditer(out)}


@pytest.fixture(scope="module")
def sync_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of a 12-iteration synchronous pendulum run (no shared memory involved)."""
    tmp = tmp_path_factory.mktemp("eval_sync")
    proc = launch(tiny_config(tmp, new_job_name(), trainer={"asynchronous": False}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return newest_checkpoint(tmp / "run")


@pytest.mark.process
def test_eval_of_an_async_run_checkpoint(tmp_path, job_name):
    proc = launch(tiny_config(tmp_path, job_name))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ckpt = newest_checkpoint(tmp_path / "run")
    proc = evaluate(str(ckpt), "--episodes", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = stats(proc.stdout)
    assert s["length"] == (PENDULUM_STEPS, PENDULUM_STEPS, PENDULUM_STEPS), proc.stdout
    mean, low, high = s["return"]
    # pendulum rewards are in [-16.3, 0] per step
    assert -16.3 * PENDULUM_STEPS <= low <= mean <= high <= 0 and low < high, proc.stdout
    assert "3 deterministic episode(s) on 3 pendulum env(s)" in proc.stdout, proc.stdout
    assert "derived from training seed 1" in proc.stdout
    # a run_dir means its newest valid checkpoint
    again = evaluate(str(tmp_path / "run"), "--episodes", "3")
    assert again.returncode == 0 and stats(again.stdout) == s, again.stdout + again.stderr


@pytest.mark.process
def test_episodes_are_deterministic_per_seed_and_the_default_seed_is_not_a_training_seed(sync_checkpoint):
    runs = [evaluate(str(sync_checkpoint), "--episodes", "4", "--seed", seed) for seed in ("5", "5", "6")]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    a, b, c = (stats(p.stdout) for p in runs)
    assert a == b and a["return"] != c["return"]
    default = evaluate(str(sync_checkpoint), "--episodes", "4")
    seed = int(re.search(r"seed (\d+) \(derived from training seed 1\)", default.stdout)[1])
    assert seed not in (1, 2)                                 # tiny_config: seed 1, one collector (seed + 0)
    train_seed_run = evaluate(str(sync_checkpoint), "--episodes", "4", "--seed", "1")
    assert stats(default.stdout)["return"] != stats(train_seed_run.stdout)["return"]


@pytest.mark.process
def test_eval_matches_the_trainers_deterministic_actions(sync_checkpoint):
    """The returns printed are those of FastSAC.act(deterministic=True) on the same envs."""
    import torch

    from fastsac.config import config_from_dict
    from fastsac.envs.registry import EnvSpec, make_env
    from fastsac.run_dir.checkpoint import load_checkpoint
    from fastsac.training import state as run_state

    payload = load_checkpoint(sync_checkpoint)
    cfg = config_from_dict(payload["config"])
    env = make_env("pendulum", 2, seed=9)
    agent, _ = run_state.build_agent(cfg, EnvSpec(3, 0, 1, PENDULUM_STEPS), env.action_low, env.action_high,
                                     torch.device("cpu"))
    agent.load_state_dict(payload["agent"])
    obs, _ = env.reset(9)
    total = np.zeros(2)
    for _ in range(PENDULUM_STEPS):
        res = env.step(agent.act(torch.from_numpy(obs), deterministic=True).numpy())
        total += res.reward
        obs = res.obs
    env.close()
    proc = evaluate(str(sync_checkpoint), "--episodes", "2", "--seed", "9")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mean, low, high = stats(proc.stdout)["return"]
    np.testing.assert_allclose([mean, low, high], [total.mean(), total.min(), total.max()], atol=2e-3)


@pytest.mark.process
def test_bad_input_is_exit_2_with_a_clear_message(sync_checkpoint, tmp_path):
    # every call in one process (support/cli_batch.py): one torch import, each call's own exit status and output
    bad = tmp_path / "bad.pt"
    bad.write_bytes(sync_checkpoint.read_bytes())
    flip_tensor_bytes(bad)
    many_episodes = ("0", "1000000000", "100000000000000000000")   # 1e9 once built one env per episode
    mujoco = __import__("importlib").util.find_spec("mujoco") is not None
    calls = [[str(tmp_path / "nope.pt")], [str(bad)], [str(sync_checkpoint), "--video"],
             *([str(sync_checkpoint), "--episodes", episodes] for episodes in many_episodes),
             [str(sync_checkpoint), "--env-name", "pendulm"],
             *([[str(sync_checkpoint), "--env-name", "halfcheetah"]] if mujoco else [])]
    results = iter(run_mains("fastsac.tools.evaluate", calls))
    proc = next(results)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "nope.pt" in proc.stderr, proc.stderr
    proc = next(results)
    assert proc.returncode == 2 and "corrupt" in proc.stderr and "bad.pt" in proc.stderr, proc.stderr
    proc = next(results)
    assert proc.returncode == 2 and "argument --video: expected one argument" in proc.stderr, proc.stderr
    for episodes in many_episodes:
        proc = next(results)
        assert proc.returncode == 2 and f"--episodes: {episodes} is out of range" in proc.stderr, proc.stderr
        assert "1 to 100,000" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = next(results)
    assert proc.returncode == 2 and "'pendulum'" in proc.stderr, proc.stderr
    if mujoco:
        proc = next(results)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        for needed in ("halfcheetah", "obs_dim=17", "act_dim=6", "pendulum", "obs_dim=3", "act_dim=1"):
            assert needed in proc.stderr, (needed, proc.stderr)


@pytest.mark.process
def test_more_episodes_than_envs_are_played_in_turn_on_a_bounded_number_of_envs(sync_checkpoint):
    from fastsac.tools.evaluate import MAX_ENVS
    proc = evaluate(str(sync_checkpoint), "--episodes", str(MAX_ENVS + 6), "--seed", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{MAX_ENVS + 6} deterministic episode(s) on {MAX_ENVS} pendulum env(s)" in proc.stdout, proc.stdout
    assert stats(proc.stdout)["length"] == (PENDULUM_STEPS, PENDULUM_STEPS, PENDULUM_STEPS), proc.stdout
