"""End-to-end: the real CLI trains, logs, checkpoints, resumes, and cleans up (CPU)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from support.e2e_helpers import job_segments, launch, newest_checkpoint, scalar_tags, tiny_config, wait_for
from support.shm_jobs import _own_segments, _unlink_names, new_job_name

from fastsac.run_dir.checkpoint import load_checkpoint

SYNC_TAGS = {"rollout/mean_return", "rollout/mean_ep_len", "perf/env_steps_per_s", "perf/updates_per_s",
             "perf/learn_pct", "train/qf_loss", "train/actor_loss", "train/alpha", "train/policy_entropy"}
ASYNC_TAGS = SYNC_TAGS | {"async/policy_lag", "async/ring_fill", "async/weight_version", "async/utd",
                          "perf/collect_ms_per_batch", "perf/collector_env_step_ms", "perf/collector_push_ms",
                          "collector0/env_steps_per_s", "collector0/ring_fill", "collector0/policy_lag"}


def _agent_loads(ckpt_path):
    payload = load_checkpoint(ckpt_path)
    assert payload["env"]["obs_dim"] == 3 and payload["agent"]["num_updates_done"] > 0
    return payload


@pytest.mark.process
def test_sync_run_writes_tensorboard_and_checkpoints(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 60},
                      env={"max_episode_steps": 20})
    proc = launch(cfg)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    tags = scalar_tags(run)
    assert SYNC_TAGS <= set(tags), SYNC_TAGS - set(tags)
    payload = _agent_loads(newest_checkpoint(run))
    assert payload["env_steps"] == 60 * 8
    assert len(list((run / "checkpoints").glob("ckpt_*.pt"))) == 5  # every 6 iterations + final, keep 5


@pytest.mark.process
def test_async_run_exits_0_with_async_metrics_and_no_segments_left(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 60}, env={"max_episode_steps": 20})
    proc = launch(cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "run"
    tags = scalar_tags(run)
    assert ASYNC_TAGS <= set(tags), ASYNC_TAGS - set(tags)
    payload = _agent_loads(newest_checkpoint(run))
    assert payload["env_steps"] == 60 * 8
    assert job_segments(job_name) == []
    assert (run / "logs" / "learner.log").exists() and (run / "logs" / "collector0.log").exists()


@pytest.mark.process
def test_resume_sync_to_async_and_back(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 10})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    first = load_checkpoint(newest_checkpoint(run))
    proc = launch(cfg, "trainer.asynchronous=true", "trainer.num_iterations=20", "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resume: loaded" in proc.stdout
    second = load_checkpoint(newest_checkpoint(run))
    assert second["env_steps"] == 20 * 8
    assert second["agent"]["num_updates_done"] > first["agent"]["num_updates_done"]
    proc = launch(cfg, "trainer.asynchronous=false", "trainer.num_iterations=25", "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    third = load_checkpoint(newest_checkpoint(run))
    assert third["env_steps"] == 25 * 8
    # 5 more iterations of 1 update; the first has nothing to sample yet (the replay buffer is not
    # restored and an entry needs its successor), so exactly 4 updates were added.
    assert third["agent"]["num_updates_done"] == second["agent"]["num_updates_done"] + 4
    assert job_segments(job_name) == []


@pytest.mark.process
def test_corrupt_checkpoint_on_resume_exits_2_and_loses_nothing(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 4})
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    for mode in ("false", "true"):
        proc = launch(cfg, f"trainer.asynchronous={mode}", f"resume={bad}")
        assert proc.returncode == 2, (mode, proc.stdout, proc.stderr)
        assert "corrupt or truncated" in proc.stdout + proc.stderr
    assert bad.read_bytes() == b"not a checkpoint"
    assert job_segments(job_name) == []


@pytest.mark.process
def test_checkpoint_weights_load_into_a_fresh_agent(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 6})
    assert launch(cfg).returncode == 0
    payload = load_checkpoint(newest_checkpoint(tmp_path / "run"))
    import numpy as np

    from fastsac.algo.fastsac import FastSAC
    from fastsac.config import load_config
    c = load_config(cfg)
    agent = FastSAC(3, 0, 1, np.array([-2.0], np.float32), np.array([2.0], np.float32), c.algo, torch.device("cpu"))
    agent.load_state_dict(payload["agent"])
    obs = torch.zeros(4, 3)
    assert agent.act(obs, deterministic=True).shape == (4, 1)


@pytest.mark.process
@pytest.mark.parametrize("first", ["sync", "async"])
def test_a_second_job_on_a_run_dir_in_use_is_refused_naming_the_holder(tmp_path, job_name, first):
    # before: both ran, interleaving learner.log, two TensorBoard files in tb/, both runs' checkpoints
    run = tmp_path / "run"
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 100000, "asynchronous": first == "async"})
    holder = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    other = new_job_name()
    try:
        wait_for(lambda: list((run / "tb").glob("events.*")), 120, "the first job to write TensorBoard")
        for mode in ("sync", "async"):
            for resume in ("", "auto"):
                proc = launch(cfg, f"job_name={other}", f"trainer.asynchronous={mode == 'async'}",
                              f"resume={resume}")
                assert proc.returncode == 2, (mode, resume, proc.stdout + proc.stderr)
                assert f"run_dir: '{run}' is in use by job '{job_name}' (pid {holder.pid} on" in proc.stderr, \
                    (mode, resume, proc.stderr)
        assert len(list((run / "tb").glob("events.*"))) == 1 and job_segments(other) == []
        os.kill(holder.pid, signal.SIGTERM)
        holder.communicate(timeout=120)
        assert holder.returncode == 0
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
        _unlink_names(_own_segments(other + "."))
    # the lock ends with its job: the run goes on under another job name
    proc = launch(cfg, f"job_name={other}", "resume=auto", "trainer.num_iterations=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
