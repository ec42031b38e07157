"""Evaluation during training (eval.*): the episode runner, the evaluator's channel, the sync
trainer's inline evaluation read back from real TensorBoard files, and the plan.

The async evaluator process (its own weight snapshot and channel, supervised, never a ring) is
exercised end to end in tests/process/evaluation/test_evaluation_async.py.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml
from support.e2e_helpers import launch, tiny_config
from support.eval_runs import EVAL_TAGS, PENDULUM_STEPS, eval_points, with_eval

from fastsac import shm_layout as shm


# --------------------------------------------------------------------------- the channel

@pytest.mark.process
def test_eval_channel_has_one_writer_and_readers_see_whole_results(job_name):
    ch = shm.EvalChannel.create_or_attach(job_name, 42)
    try:
        obs = shm.EvalChannel.attach(job_name, 42)
        assert obs.read_result() is None
        with pytest.raises(shm.ShmLayoutError, match="already has an evaluator"):
            shm.EvalChannel.create_or_attach(job_name, 42)
        with pytest.raises(shm.ShmLayoutError, match="may not write"):
            obs.beat()
        with pytest.raises(shm.ShmLayoutError, match="incarnation"):
            shm.EvalChannel.attach(job_name, 43)
        result = {"env_steps": 4096, "weight_version": 9, "episodes": 16, "mean_return": -150.5,
                  "min_return": -300.25, "max_return": -1.0, "mean_ep_len": 200.0, "min_ep_len": 200,
                  "max_ep_len": 200, "seconds": 0.75, "finished_ns": 1}
        assert ch.write_result(result) == 1
        got = obs.read_result()
        assert got == (1, result) and obs.read_result(last=1) is None
        ch._seq[0] += 1                       # a writer caught mid-write: readers back off
        assert obs.read_result() is None
        ch._seq[0] -= 1
        ch.update(incarnation=3, state=int(shm.ProcState.RUNNING))
        ch.beat()
        st = obs.status()
        assert st["incarnation"] == 3 and st["pid"] > 0 and obs.heartbeat_age_s() < 5
        obs.close()
    finally:
        ch.close()
    # a restart re-attaches the same segment (same launch) and keeps the result
    again = shm.EvalChannel.create_or_attach(job_name, 42)
    assert again.read_result()[1]["env_steps"] == 4096
    again.close()


@pytest.mark.process
def test_stale_eval_segments_are_found_and_removed_by_cleanup(job_name):
    ch = shm.EvalChannel.create_or_attach(job_name, 7)
    snap = shm.WeightSnapshot.create_or_attach(job_name, shm.EVALUATOR_ID, 16, 7)
    assert snap.name == f"/fastsac.{job_name}.eval.wts" and ch.name == f"/fastsac.{job_name}.eval"
    ch.close()
    snap.close()
    stale = sorted(s.name for s in shm.find_stale_segments(job_name))
    assert stale == [f"/fastsac.{job_name}.eval", f"/fastsac.{job_name}.eval.wts"]
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", "--cleanup", job_name], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not shm.find_stale_segments(job_name) and not shm.segment_exists(shm.eval_name(job_name))


# --------------------------------------------------------------------------- sync trainer

@pytest.mark.process
def test_sync_trainer_logs_eval_scalars_at_each_interval(tmp_path, job_name):
    cfg = with_eval(tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 30}),
                    interval=10, episodes=3, num_envs=2)
    proc = launch(cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = eval_points(tmp_path / "run")
    assert sorted(points) == sorted(EVAL_TAGS), points
    n_envs = 8
    for tag, series in points.items():
        assert [s for s, _ in series] == [10 * n_envs, 20 * n_envs, 30 * n_envs], (tag, series)
        assert all(math.isfinite(v) for _, v in series), (tag, series)
    for tag in ("eval/mean_ep_len", "eval/min_ep_len", "eval/max_ep_len"):
        assert [v for _, v in points[tag]] == [PENDULUM_STEPS] * 3
    for (_, lo), (_, mean), (_, hi) in zip(points["eval/min_return"], points["eval/mean_return"],
                                           points["eval/max_return"]):
        assert -16.3 * PENDULUM_STEPS <= lo <= mean <= hi <= 0
    assert proc.stdout.count("eval @ ") == 3 and "3 episodes in" in proc.stdout


# --------------------------------------------------------------------------- the plan

def plan_text(*overrides: str, as_json: bool = False, config: str = "configs/quickstart.yaml") -> str:
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", config, *overrides, "--plan",
                           *(["--json"] if as_json else [])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.process
def test_the_plan_has_an_evaluator_only_with_eval_on(tmp_path):
    path = tmp_path / "job.yaml"
    base = yaml.safe_load(open("configs/quickstart.yaml"))
    base.pop("eval", None)
    plans = []
    for ev in (None, {"interval": 0, "cpus": 2, "episodes": 3, "num_envs": 4}):
        path.write_text(yaml.safe_dump(base if ev is None else {**base, "eval": ev}))
        plans.append((plan_text(config=str(path)), plan_text(config=str(path), as_json=True)))
    assert plans[0] == plans[1]          # eval off: the plan is byte for byte the plan without eval keys
    assert "fastsac.evaluator_main" not in plans[0][0] and "evaluator" not in json.loads(plans[0][1])
    on = plan_text("eval.interval=100")
    row = [line.split() for line in on.splitlines() if line.strip().startswith("evaluator ")]
    from fastsac.common.seeds import eval_seed
    assert row and row[0][-1] == "off" and str(eval_seed(1, 1)) in row[0], on   # the derived seed, shown
    assert "-m fastsac.evaluator_main --config" in on
    ev = json.loads(plan_text("eval.interval=100", "eval.seed=77", as_json=True))["evaluator"]
    assert ev["role"] == "evaluator" and ev["seed"] == 77 and ev["argv"][1:3] == ["-m", "fastsac.evaluator_main"]
