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
