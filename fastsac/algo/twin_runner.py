"""The twin critics' halves of an update, side by side: net 0 on the calling thread, net 1 on a
worker thread, each with its own intra-op threads.

Why: on a CPU an update is a few hundred ops on [batch, 256]-sized tensors. With torch's intra-op
threads every one of them is split over the cores and joined again, a thread hand-off per op, and
GEMMs of these shapes gain only ~1.6x from a second thread. The two critics are independent from
their inputs to their gradients (and from their inputs to dQ/daction in the actor step), so each
can own a core for the whole of its forward, target projection and backward: one hand-off per half
instead of one per op, and GEMMs at their one-thread speed on every core. torch ops release the
GIL, so two Python threads run them in parallel. (benchmarks/bench_update.py measures it against
the update with intra-op threads.)

On CUDA, or with one CPU, the halves run one after the other on the calling thread: the same code,
the same results.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


class TwinRunner:
    """run(fn, *args) -> (fn(0, *args), fn(1, *args)); in parallel once set_threads(n >= 2) on a CPU."""

    def __init__(self, device: torch.device):
        self.on_cpu = torch.device(device).type == "cpu"
        self._worker: ThreadPoolExecutor | None = None

    @property
    def parallel(self) -> bool:
        return self._worker is not None

    def set_threads(self, n: int) -> None:
        """The CPUs this agent's updates may use. On a CPU with n >= 2: two halves of n // 2
        intra-op threads each (an odd one out stays idle: both threads must agree on MKL's
        process-wide count); else n intra-op threads on the calling thread alone."""
        n = max(1, int(n))
        if not self.on_cpu or n < 2:
            self._stop_worker()
            torch.set_num_threads(n)
            return
        per_half = n // 2
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastsac-update")
        # torch's intra-op count is per thread for OpenMP (and process-wide for MKL): set it on both
        self._worker.submit(torch.set_num_threads, per_half).result()
        torch.set_num_threads(per_half)

    def run(self, fn: Callable[..., T], *args) -> tuple[T, T]:
        return self.run_after(_nothing, fn, *args)

    def run_after(self, prepare: Callable[[], None], fn: Callable[..., T], *args) -> tuple[T, T]:
        """run(fn, *args) with prepare() on the calling thread first: in parallel, while the worker
        starts fn(1, *args), which waits for what prepare() makes where it needs it (through a
        Future among args). prepare() must resolve that Future, with its result or its error."""
        if self._worker is None:
            prepare()
            return fn(0, *args), fn(1, *args)
        second = self._worker.submit(fn, 1, *args)
        try:
            prepare()
            first = fn(0, *args)
        finally:
            wait([second])   # never leave the worker running on tensors the caller is about to change
        return first, second.result()

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def close(self) -> None:
        self._stop_worker()


def _nothing() -> None:
    """run's prepare: nothing to make first."""
