"""The learner's two waits on a CUDA device, made with events instead of synchronize:

  * ChunkTimer   how long the GPU spent on each chunk of updates (perf/learn_pct), from a pair
                 of timing events per chunk read once they completed: the host goes on queueing
                 the next chunk, ingest and publish while the GPU works;
  * WeightCopy   the weight publish's device->host copy: into pinned memory, non-blocking, with
                 an event; the snapshot writes happen once the event completed (polled every
                 iteration), and the next copy into the same pinned vector waits for it first.

On the CPU both do what the loop always did: the host clock, and a copy that is done at once.
Every event is recorded on the current stream of the learner's device (fastsac.process.torch_runtime
made that device current first thing).
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from fastsac.learner.staging import allocate


class ChunkTimer:
    """Seconds spent in update chunks, added to `sink(seconds)` once known."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.pending: deque = deque()
        self.t0 = 0.0

    def start(self):
        """Mark the start of a chunk; returns the token end() takes."""
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def end(self, token, chunk: int) -> float | None:
        """Mark its end: the host seconds on the CPU (known now), None on CUDA (collect() later)."""
        if not self.cuda:
            return time.perf_counter() - token
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        self.pending.append((token, ev, chunk))
        return None

    def collect(self, wait: bool = False) -> float:
        """GPU seconds of the chunks that completed since the last call (all of them with wait)."""
        spent = 0.0
        while self.pending and (wait or self.pending[0][1].query()):
            start, end, _ = self.pending.popleft()
            end.synchronize()
            spent += start.elapsed_time(end) / 1e3
        return spent


class WeightCopy:
    """The flat actor weights, device -> pinned host, without blocking the next update."""

    def __init__(self, numel: int, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        host, _ = allocate(numel * 4, device, twin=False)
        self.host = host.view(torch.float32)
        self.host_np = self.host.numpy()
        self.done = torch.cuda.Event() if self.cuda else None
        self.pending = False

    def start(self, flat: torch.Tensor) -> None:
        """Copy `flat` (on the device) into the pinned vector; the caller has taken the last one."""
        self.wait()   # the DMA of the previous copy may still read into the same pinned vector
        self.host.copy_(flat.detach().reshape(-1), non_blocking=self.cuda)
        if self.cuda:
            self.done.record(torch.cuda.current_stream(self.device))
        self.pending = True

    def ready(self) -> bool:
        """A copy was started and has completed: host_np holds its weights."""
        return self.pending and (not self.cuda or self.done.query())

    def wait(self) -> None:
        if self.pending and self.cuda:
            self.done.synchronize()

    def take(self) -> np.ndarray:
        """The weights of the last copy (waits for it), and the copy counts as consumed."""
        self.wait()
        self.pending = False
        return self.host_np
