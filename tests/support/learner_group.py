"""A learner group's config on a local rendezvous (gloo on the CPU, 127.0.0.1): what the in-process
and the multi-process tests of fastsac.learner.distributed share."""
from __future__ import annotations

from fastsac.config import Config

GROUP_TIMEOUT_S = 60.0      # distributed.timeout_s: far above what a killed peer may take to be noticed


def group_config(port: int, world: int, timeout_s: float = GROUP_TIMEOUT_S) -> Config:
    cfg = Config()
    d = cfg.distributed
    d.num_learners, d.nnodes, d.node_rank = world, 1, 0
    d.master_addr, d.master_port, d.backend, d.timeout_s = "127.0.0.1", port, "gloo", timeout_s
    return cfg
