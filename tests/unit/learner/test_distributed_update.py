"""Data-parallel learners (fastsac.learner.distributed) in this process: a rendezvous nobody answers
and a backend the learner's device cannot run. Two learner ranks on real processes (gloo on the CPU):
tests/process/learner/test_distributed_update_process.py.
"""
from __future__ import annotations

import pytest
import torch
from support.e2e_helpers import free_port
from support.learner_group import group_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_join_names_the_unreachable_rendezvous():
    from fastsac.learner.distributed import DistributedError, LearnerGroup
    port = free_port()
    cfg = group_config(port, 2, timeout_s=2.0)
    with pytest.raises(DistributedError, match=rf"learner rank 1 \(node_rank 0\): nobody answered at "
                                               rf"127\.0\.0\.1:{port} within distributed\.timeout_s=2 s"):
        LearnerGroup.join(cfg, 1, torch.device("cpu"), log=lambda m: None)


def test_nccl_backend_on_a_cpu_learner_is_refused():
    from fastsac.learner.distributed import DistributedError, LearnerGroup
    cfg = group_config(free_port(), 2)
    cfg.distributed.backend = "nccl"
    with pytest.raises(DistributedError, match="backend=nccl needs CUDA learners"):
        LearnerGroup.join(cfg, 0, torch.device("cpu"), log=lambda m: None)


def test_the_control_plane_is_a_gloo_group_of_its_own_and_gradients_use_the_default():
    """NCCL fails late (its collectives return before they completed): stop flags, counters,
    normalizers and the agent broadcast run on a gloo group, gradients on the default group."""
    import torch.distributed as dist

    from fastsac.learner.distributed import LearnerGroup
    group = LearnerGroup.join(group_config(free_port(), 1), 0, torch.device("cpu"), log=lambda m: None)
    try:
        assert group.control is not None and group.control is not dist.group.WORLD
        assert dist.get_backend(group.control) == "gloo"
        calls = []
        real_gather, real_reduce = dist.all_gather_single, dist.all_reduce
        try:
            dist.all_gather_single = lambda out, t, group=None: calls.append(("gather", group)) or \
                real_gather(out, t, group=group)
            dist.all_reduce = lambda t, op=None, group=None: calls.append(("reduce", group)) or \
                real_reduce(t, op=op, group=group)
            import fastsac.learner.distributed as d
            saved, d._ALL_GATHER_FLAT = d._ALL_GATHER_FLAT, dist.all_gather_single
            try:
                group.exchange({"a": 1.0}, {"stop": 0.0})
                p = torch.nn.Parameter(torch.ones(3))
                p.grad = torch.full((3,), 2.0)
                group._average_grads([p])
            finally:
                d._ALL_GATHER_FLAT = saved
        finally:
            dist.all_gather_single, dist.all_reduce = real_gather, real_reduce
        assert calls == [("gather", group.control), ("reduce", None)]
        assert group.settle() is None          # gloo: every collective completed in its call
    finally:
        group.close()


def test_settle_after_a_failure_aborts_an_nccl_plane_whose_work_never_completes(monkeypatch):
    """A gradient all-reduce a dead peer never joins holds the GPU: settle() aborts the plane and
    says the weights are not the job's (rank 0 then writes no final checkpoint of them)."""
    import torch.distributed as dist
    from support.fake_cuda import FakeCuda

    from fastsac.learner.distributed import LearnerGroup
    cuda = FakeCuda(monkeypatch, count=2).install()
    aborted = []
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", lambda group=None: aborted.append(group))
    g = LearnerGroup(group_config(free_port(), 2), 0, 2, "nccl", torch.device("cuda", 1), None, None, control=None)
    reason = g.settle(wait_s=0.05)
    assert reason == "the GPU's queued gradient all-reduces did not complete within 0.05 s of the failure"
    assert aborted == [None] and ("record", 1) in cuda.calls
    g2 = LearnerGroup(group_config(free_port(), 2), 0, 2, "nccl", torch.device("cuda", 1), None, None, control=None)
    cuda.auto_complete = True
    assert g2.settle(wait_s=0.05) is None   # the queued work completed: the weights are sound
    g2.abort_gradients(1)                    # what the beacon does when rank 1 went silent
    assert g2.settle() == "a gradient all-reduce was cut off: learner rank 1 (node_rank 0) was silent for 10 s"


def test_the_beacon_calls_its_silence_hook_once_for_a_rank_that_stopped_beating(monkeypatch):
    import time

    import fastsac.learner.distributed as d

    class Client:
        def __init__(self, *a, **k):
            pass

        def set(self, key, value):
            pass

        def multi_get(self, keys):
            return [b"1"] * len(keys)     # rank 1's beat never changes

    monkeypatch.setattr(d.dist, "TCPStore", Client)
    monkeypatch.setattr(d, "ABORT_AFTER_S", 0.1)
    monkeypatch.setattr(d, "BEAT_INTERVAL_S", 0.02)
    silent = []
    beacon = d._Beacon("127.0.0.1", 1, 0, 2)
    beacon.on_silent = silent.append
    time.sleep(0.4)
    beacon.stop()
    assert silent == [1]
