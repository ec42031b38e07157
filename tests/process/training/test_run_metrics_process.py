"""What every run reports, and the seeds a resumed run re-resets its envs with."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from support.e2e_helpers import launch, scalar_tags, tiny_config
from support.eval_runs import with_eval


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


@pytest.mark.process
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_says_when_it_started_how_far_it_is_and_sums_up_at_the_end(tmp_path, job_name, mode):
    cfg = with_eval(tiny_config(tmp_path, job_name, env={"num_envs": 8}, logging={"interval": 5},
                                trainer={"num_iterations": 30, "asynchronous": mode == "async"}),
                    interval=10, episodes=2, num_envs=2)
    result = launch(cfg)
    assert result.returncode == 0, result.stdout + result.stderr
    out, run = result.stdout, tmp_path / "run"
    assert re.search(r"^run started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", out, re.M), out
    # pendulum episodes are 200 steps: none ended in 30 iterations, and the line says why
    progress = [x for x in out.splitlines() if re.match(r"^\[\d+/30\] ", x)]
    assert progress and all("return - (no episode ended yet; episodes are 200 steps)" in x for x in progress), out
    assert re.search(r"\| \d+s, ETA \d+s$", progress[-1]), progress[-1]
    if mode == "sync":   # inline eval comes before the next line; the evaluator process may answer after the last
        assert any(" | eval -" in x for x in progress), out             # the eval return, once known
    summary = out[out.index("run summary: "):]
    for needed in ("240 env steps", "eval return (deterministic, 2 episodes): final", "best",
                   f"checkpoint: {run / 'checkpoints'}", f"tensorboard --logdir {run / 'tb'}",
                   f"fastsac-eval {run}", f"fastsac-export {run} --format onnx {run / 'actor.onnx'}"):
        assert needed in summary, (needed, summary)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    tags = scalar_tags(run)
    file_tags = {k for r in rows for k in r} - {"env_steps", "wall_time", "run_id", "incarnation"}
    assert {(r["run_id"], r["incarnation"]) for r in rows} == {(rows[0]["run_id"], 1)}   # one run, its first start
    assert file_tags == set(tags), (sorted(file_tags ^ set(tags)))      # the same names as TensorBoard
    assert [r["eval/mean_return"] for r in rows if "eval/mean_return" in r] == \
        pytest.approx(tags["eval/mean_return"], rel=1e-6)


@pytest.mark.process
@pytest.mark.parametrize("mode", ["async"])     # the sink is the trainers' common MetricsLogger
def test_weights_and_biases_gets_the_same_scalars_offline(tmp_path, job_name, mode):
    pytest.importorskip("wandb", reason="logging.wandb needs the wandb extra (pip install 'fastsac[wandb]')")
    cfg = with_eval(tiny_config(tmp_path, job_name, env={"num_envs": 8}, logging={"interval": 5},
                                trainer={"num_iterations": 30, "asynchronous": mode == "async"}),
                    interval=10, episodes=2, num_envs=2)
    env = {**__import__("os").environ, "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    result = launch(cfg, "logging.wandb.enabled=true", "logging.wandb.mode=offline", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((tmp_path / "run").rglob("*"))
    # the offline run file holds one history record per logged row: each metric's name once per point
    # (W&B's own reader of the file is internal; the names are plain strings in its protobuf records)
    data = files[0].read_bytes()
    tags = scalar_tags(tmp_path / "run")
    for tag in ("perf/updates_per_s", "eval/mean_return", "perf/learn_pct"):
        assert data.count(tag.encode()) >= len(tags[tag]) >= 1, (tag, data.count(tag.encode()), len(tags[tag]))


@pytest.mark.process
def test_weights_and_biases_without_its_extra_is_exit_2(tmp_path, job_name):
    import subprocess
    import sys
    cfg = tiny_config(tmp_path, job_name)
    code = ("import sys, importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n == 'wandb' else real(n, *a); "
            "from fastsac.launcher import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, str(cfg), "logging.wandb.enabled=true"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "logging.wandb.enabled: true needs Weights & Biases" in proc.stderr, proc.stderr
    assert "pip install 'fastsac[wandb]'" in proc.stderr and not (tmp_path / "run").exists()
