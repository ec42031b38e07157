"""Evaluation during training (eval.*): the episode runner, the evaluator's channel, the sync
trainer's inline evaluation read back from real TensorBoard files, and the plan.

The async evaluator process (its own weight snapshot and channel, supervised, never a ring) is
exercised end to end in tests/test_evaluation_async.py.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import yaml
from e2e_helpers import launch, tiny_config

from fastsac import shm_layout as shm
from fastsac.common.seeds import resolve_eval_seed
from fastsac.config import config_from_dict
from fastsac.run import eval_episodes
from fastsac.run.eval_episodes import quotas, run_eval_episodes
from fastsac.shm_layout.eval_channel import pack_weights, snapshot_numel, unpack_tag

PENDULUM_STEPS = 200
EVAL_TAGS = ("eval/mean_return", "eval/mean_ep_len", "eval/min_return", "eval/max_return", "eval/min_ep_len",
             "eval/max_ep_len", "eval/seconds")


def with_eval(path, **ev):
    """tiny_config's file with an eval section."""
    d = yaml.safe_load(path.read_text())
    d["eval"] = ev
    path.write_text(yaml.safe_dump(d))
    return path


def eval_points(run_dir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every eval/* scalar in the run's TensorBoard files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"] if t.startswith("eval/")}


# --------------------------------------------------------------------------- episodes

def test_episodes_are_split_over_the_envs():
    assert quotas(16, 16) == [1] * 16
    assert quotas(5, 2) == [3, 2]
    assert quotas(3, 16) == [1, 1, 1]      # never more envs than episodes
    assert sum(quotas(17, 4)) == 17 and max(quotas(17, 4)) - min(quotas(17, 4)) == 1


def test_run_eval_episodes_plays_each_envs_share_and_is_deterministic(monkeypatch):
    from fastsac.envs.registry import make_env
    env = make_env("pendulum", 2, seed=7)
    act = lambda obs: np.zeros((obs.shape[0], 1), np.float32)   # noqa: E731
    returns, lengths = run_eval_episodes(act, env, 7, 5)
    assert len(returns) == 5 and (lengths == PENDULUM_STEPS).all()
    assert np.isfinite(returns).all() and (returns <= 0).all()
    again, _ = run_eval_episodes(act, env, 7, 5)          # every evaluation starts from the same states
    assert np.array_equal(returns, again)
    other, _ = run_eval_episodes(act, env, 8, 5)
    assert not np.array_equal(returns, other)
    calls = []
    monkeypatch.setattr(eval_episodes, "STEP_CALLBACK_S", 0.0)   # the callback after every step
    assert run_eval_episodes(act, env, 7, 5, on_step=lambda: calls.append(1) or len(calls) < 3) is None
    assert len(calls) == 3                                   # a stop abandons the evaluation at once
    env.close()


def test_the_weight_tag_travels_with_the_weights():
    flat = np.arange(10, dtype=np.float32)
    buf = np.zeros(snapshot_numel(10), np.float32)
    pack_weights(buf, flat, 123_456_789_012, 77)
    assert np.array_equal(buf[:10], flat) and unpack_tag(buf) == (123_456_789_012, 77)


def test_the_eval_seed_is_none_of_the_training_seeds():
    for seed in (0, 1, 5, 4_294_967_290):
        for n in (1, 2, 8):
            cfg = config_from_dict({"seed": seed, "trainer": {"async_options": {"num_collectors": n}},
                                    "env": {"num_envs": 8}})
            ev = resolve_eval_seed(cfg)
            assert ev not in {seed + i for i in range(n)}, (seed, n, ev)
            assert 0 <= ev <= 2**32 - 1
    cfg = config_from_dict({"seed": 1, "eval": {"seed": 99}})
    assert resolve_eval_seed(cfg) == 99
    with pytest.raises(Exception, match="eval.seed: 2 is the seed of training collector 1"):
        config_from_dict({"seed": 1, "eval": {"seed": 2}, "trainer": {"async_options": {"num_collectors": 2}},
                          "env": {"num_envs": 8}})


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


def test_a_bound_plan_gives_the_evaluator_its_own_cpus_from_the_learners(tmp_path):
    from fake_sysfs import two_nodes

    from fastsac.machine.plan import plan_job
    from fastsac.machine.topology import discover_topology
    cfg = config_from_dict({"device": "cpu", "env": {"num_envs": 8}, "eval": {"interval": 10, "cpus": 2},
                            "trainer": {"async_options": {"num_collectors": 2, "numa_binding": "inprocess",
                                                          "cpus_per_collector": 1}}})
    plan = plan_job(cfg, discover_topology(two_nodes(tmp_path / "two", gpu_node=None)), "job.yaml",
                    numactl_path=None)
    ev, lr = plan.evaluator, plan.learner
    assert ev.node == lr.node and len(ev.cpus) == 2 and lr.cpus and not set(ev.cpus) & set(lr.cpus)
    assert not set(ev.cpus) & {c for col in plan.collectors for c in col.cpus}
    assert ev.argv[ev.argv.index("--bind-cpus") + 1] == ev.cpulist
    # too few CPUs left for both: they share the learner's, and the plan says so
    cfg.eval.cpus = 3
    plan = plan_job(cfg, discover_topology(two_nodes(tmp_path / "two2", gpu_node=None)), "job.yaml",
                    numactl_path=None)
    assert plan.evaluator.cpus == plan.learner.cpus and any("shares the learner's CPUs" in n for n in plan.notes)


def test_eval_cpus_without_binding_is_said_in_the_plan_not_dropped_silently(tmp_path):
    from fake_sysfs import two_nodes

    from fastsac.machine.plan import plan_job
    from fastsac.machine.topology import discover_topology
    cfg = config_from_dict({"device": "cpu", "env": {"num_envs": 8}, "eval": {"interval": 10, "cpus": 64},
                            "trainer": {"async_options": {"numa_binding": "off"}}})
    plan = plan_job(cfg, discover_topology(two_nodes(tmp_path / "two", gpu_node=None)), "job.yaml",
                    numactl_path=None)
    assert any(n.startswith("eval.cpus=64 is not applied: without binding") for n in plan.notes), plan.notes
