"""Evaluation during training (eval.*): the episode runner, the evaluator's channel, the sync
trainer's inline evaluation read back from real TensorBoard files, and the plan.

The async evaluator process (its own weight snapshot and channel, supervised, never a ring) is
exercised end to end in tests/process/evaluation/test_evaluation_async.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from support.eval_runs import PENDULUM_STEPS

from fastsac.common.seeds import resolve_eval_seed
from fastsac.config import config_from_dict
from fastsac.evaluation import episodes as eval_episodes
from fastsac.evaluation.episodes import quotas, run_eval_episodes
from fastsac.shm_layout.eval_channel import pack_weights, snapshot_numel, unpack_tag


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


def test_a_bound_plan_gives_the_evaluator_its_own_cpus_from_the_learners(tmp_path):
    from support.fake_sysfs import two_nodes

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
    from support.fake_sysfs import two_nodes

    from fastsac.machine.plan import plan_job
    from fastsac.machine.topology import discover_topology
    cfg = config_from_dict({"device": "cpu", "env": {"num_envs": 8}, "eval": {"interval": 10, "cpus": 64},
                            "trainer": {"async_options": {"numa_binding": "off"}}})
    plan = plan_job(cfg, discover_topology(two_nodes(tmp_path / "two", gpu_node=None)), "job.yaml",
                    numactl_path=None)
    assert any(n.startswith("eval.cpus=64 is not applied: without binding") for n in plan.notes), plan.notes
