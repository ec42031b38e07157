"""One staging area for every ring: the learner's host->device path.

Each ingest round the learner copies the ready slots of all collectors into ONE host buffer
(pinned on CUDA, allocated by the learner, so on its NUMA node), packed: per collector the
dense part of its k slots, then only the final-observation rows that episodes really used,
never a slot's reserved space. The used bytes go to the device in ONE non-blocking copy, and the
replay buffer is extended from device views of it. On CPU the staging buffer is the destination
(no copy at all); the code path is the same.

A transition byte is therefore copied twice between env and replay buffer on a CPU learner
(env -> ring slot by the collector, ring -> staging by the learner; the buffer write is the
third) and three times on CUDA (plus staging -> device): the ring copy is what lets the
collector reuse its slot at once, and the pinned staging is what makes the device copy one
large asynchronous DMA instead of k x fields small synchronous ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastsac import shm_layout as shm
from fastsac.learner.feed import CollectorFeed
from fastsac.common.transition import TransitionBatch

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.uint8): torch.uint8,
                 np.dtype(np.int64): torch.int64}


def allocate(nbytes: int, device: torch.device, twin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(host, device) byte buffers: pinned host memory and (twin) its device twin on CUDA (a copy
    from pageable memory is staged through a driver buffer and blocks), one buffer on the CPU."""
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    if not cuda:
        return host, host
    return host, torch.empty(nbytes, dtype=torch.uint8, device=device) if twin else None


@dataclass
class StagedRun:
    """k slots of one collector in the staging buffer."""
    feed: CollectorFeed
    slots: shm.StagedSlots        # typed views of the staged bytes, and where they lie in the buffer

    @property
    def k(self) -> int:
        return self.slots.k

    @property
    def offsets(self) -> list[int]:
        return self.slots.offsets


class IngestStaging:
    def __init__(self, specs: list["shm.RingSpec"], max_slots: int, device: torch.device):
        # Worst case of one round: every slot from the ring with the largest slots, each with all
        # its final rows (dense + finals <= slot_nbytes, plus alignment of the two pieces).
        self.nbytes = max(s.staging_nbytes(max_slots) for s in specs)
        self.cuda = device.type == "cuda"
        self.device = device
        self.host, self.dev = allocate(self.nbytes, device)
        self.host_np = self.host.numpy()
        # the copy runs on the current stream of the device of self.dev; the event is recorded on
        # that very stream (not on the current device's: with cuda:N, N >= 1, and no set_device that
        # would be GPU 0's, and the event would not cover the copy)
        self.copy_done = torch.cuda.Event() if self.cuda else None
        self.used = 0
        self.copies = 0          # host->device copies issued (one per round that staged anything)

    def begin(self) -> None:
        """Start a round: the previous round's device copy must be done before we overwrite the
        pinned bytes it reads (the DMA runs after send() returned)."""
        if self.copy_done is not None:
            self.copy_done.synchronize()
        self.used = 0

    def take(self, feed: CollectorFeed, max_slots: int) -> StagedRun:
        """Copy up to max_slots of the feed's ready slots into the buffer (not released yet)."""
        k = min(feed.available(), max_slots)   # only the learner releases: k slots stay ready
        slots = feed.ring.copy_into(self.host_np, self.used, k)
        self.used = slots.span.end
        return StagedRun(feed, slots)

    def rewind(self, run: StagedRun) -> None:
        """Forget a run (its collector was dropped): the next one overwrites its bytes."""
        self.used = run.slots.span.dense_at

    def send(self) -> None:
        """ONE host->device copy of everything staged this round (non-blocking from pinned memory)."""
        if self.cuda and self.used:
            self.dev[:self.used].copy_(self.host[:self.used], non_blocking=True)
            self.copy_done.record(torch.cuda.current_stream(self.device))
        if self.used:
            self.copies += 1

    def slots(self, run: StagedRun):
        """Per slot: a TransitionBatch of device tensors, views of the staged bytes."""
        return run.slots.twin(self.dev, _TORCH_DTYPES.__getitem__).batches()
