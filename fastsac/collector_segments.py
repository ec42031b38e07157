"""A collector's own segments: attach if they exist (a restart keeps unread slots), else create.

Torch-free (used by the NUMA check mode too). Creating them here, in the collector under
its binding, is what first-touches their pages on the collector's node.
"""
from __future__ import annotations

import os

from fastsac import shm_layout as shm


def segment_exists(name: str) -> bool:
    return os.path.exists(shm.SHM_DIR + name)


def open_ring(job: str, cid: int, spec: "shm.RingSpec", incarnation: int) -> "shm.TransitionRing":
    if segment_exists(shm.ring_name(job, cid)):
        return shm.TransitionRing.attach(job, cid, spec, role="producer", incarnation=incarnation)
    return shm.TransitionRing.create(job, cid, spec, incarnation)


def open_snapshot(job: str, cid: int, numel: int, incarnation: int) -> "shm.WeightSnapshot":
    if segment_exists(shm.wts_name(job, cid)):
        return shm.WeightSnapshot.attach(job, cid, numel, role="reader", incarnation=incarnation)
    return shm.WeightSnapshot.create(job, cid, numel, incarnation)
