"""What every run reports, and the seeds a resumed run re-resets its envs with."""
from __future__ import annotations

import numpy as np
import pytest
from e2e_helpers import launch, scalar_tags, tiny_config

from fastsac.common.seeds import reset_seed
from fastsac.envs.pendulum import PendulumSwingUp


@pytest.mark.process
def test_a_run_shorter_than_the_log_interval_still_logs_its_final_metrics(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 8, "max_episode_steps": 5},
                      trainer={"num_iterations": 40}, logging={"interval": 10_000, "interval_s": 3600.0})
    result = launch(cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    tags = scalar_tags(tmp_path / "run")
    for tag in ("rollout/mean_return", "async/policy_lag", "perf/env_steps_per_s", "perf/ingest_env_steps_per_s",
                "perf/updates_per_s", "perf/learn_pct", "collector0/env_steps_per_s"):
        assert tag in tags, (tag, sorted(tags))
    assert tags["perf/env_steps_per_s"][-1] > 0
    assert "[40/40] 320 steps" in result.stdout, result.stdout


@pytest.mark.process
def test_a_short_synchronous_run_logs_its_final_metrics_once(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 8, "max_episode_steps": 5},
                      trainer={"num_iterations": 30, "asynchronous": False},
                      logging={"interval": 10_000, "interval_s": 3600.0})
    result = launch(cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    tags = scalar_tags(tmp_path / "run")
    assert len(tags["perf/env_steps_per_s"]) == 1 and tags["perf/env_steps_per_s"][0] > 0
    assert "rollout/mean_return" in tags and "perf/learn_pct" in tags
    assert result.stdout.count("[30/30] 240 steps") == 1, result.stdout


@pytest.mark.process
def test_collector_rates_come_from_their_counters_at_any_logging_rate(tmp_path, job_name):
    """Logging far faster than the collectors refresh their stats record (pendulum, 0.05 s):
    every window's rate is what the collectors' step counters say, never a fallback."""
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 8},
                      trainer={"num_iterations": 600, "async_options": {"num_collectors": 2}},
                      algo={"num_updates": 0}, logging={"interval": 10_000, "interval_s": 0.05})
    result = launch(cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    tags = scalar_tags(tmp_path / "run")
    total, c0, c1 = (np.array(tags[t]) for t in ("perf/env_steps_per_s", "collector0/env_steps_per_s",
                                                   "collector1/env_steps_per_s"))
    assert len(total) >= 3
    np.testing.assert_allclose(total, c0 + c1, rtol=1e-6)
    assert np.median(c0) > 0 and np.median(c1) > 0, (c0, c1)


def test_a_resumed_run_resets_its_envs_with_a_new_reproducible_seed():
    env = PendulumSwingUp(num_envs=16, seed=0)
    fresh = env.reset(reset_seed(7))[0].copy()
    assert reset_seed(7) == 7                                   # a fresh start is unchanged
    resumed = env.reset(reset_seed(7, start_env_steps=4096))[0].copy()
    again = env.reset(reset_seed(7, start_env_steps=4096))[0].copy()
    other = env.reset(reset_seed(7, start_env_steps=8192))[0].copy()
    restarted = env.reset(reset_seed(7, restart=1, start_env_steps=4096))[0].copy()
    assert not np.allclose(resumed, fresh), "a resumed run replays the original run's first episodes"
    np.testing.assert_array_equal(resumed, again)              # the same resume: the same observations
    assert not np.allclose(other, resumed) and not np.allclose(restarted, resumed)


@pytest.mark.process
def test_a_run_that_ends_right_after_a_log_writes_no_second_point_at_that_step(tmp_path, job_name):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 20}, logging={"interval": 5, "interval_s": 3600.0})
    result = launch(cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("perf/env_steps_per_s")]
    assert len(steps) == len(set(steps)), steps
    assert all(e.value > 0 for e in acc.Scalars("perf/env_steps_per_s")), acc.Scalars("perf/env_steps_per_s")
