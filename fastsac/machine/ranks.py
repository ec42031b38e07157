"""Learner ranks of a data-parallel job, torch-free (the launcher and the placement import it).

A job has `nnodes` machines with `num_learners` learner processes each; learner `local_index`
of machine `node_rank` is global rank node_rank * num_learners + local_index. Rank 0 (node 0,
local learner 0) hosts the rendezvous store and does the job's logging and checkpoints
(fastsac.learner.distributed). world_size 1 means no process group at all.
"""
from __future__ import annotations


def world_size(cfg) -> int:
    """Learner processes in the whole job (every machine runs the same num_learners)."""
    return cfg.distributed.nnodes * cfg.distributed.num_learners


def global_rank(cfg, local_index: int) -> int:
    """The global rank of this machine's learner `local_index` (0 <= local_index < num_learners)."""
    d = cfg.distributed
    if not 0 <= local_index < d.num_learners:
        raise ValueError(f"learner local_index {local_index} is outside 0..{d.num_learners - 1} "
                         f"(distributed.num_learners={d.num_learners})")
    return d.node_rank * d.num_learners + local_index


def node_of(cfg, rank: int) -> int:
    """The node_rank of the machine that runs global rank `rank` (for messages)."""
    return rank // cfg.distributed.num_learners
