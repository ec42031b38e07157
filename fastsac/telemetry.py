"""TensorBoard scalars and the console progress line, shared by both trainers.

Metric names (documented in docs/design.md) are the contract: the synchronous trainer
and the async learner write the same names so runs compare side by side.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fmt(value: float, spec: str = ".1f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


class MetricsLogger:
    """Writes scalars to TensorBoard under run_path/tb and progress lines to stdout."""

    def __init__(self, run_path: Path, tensorboard: bool = True, console: bool = True):
        self.console_enabled = console
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(Path(run_path) / "tb"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                self.writer.add_scalar(name, float(value), step)

    def line(self, text: str) -> None:
        if self.console_enabled:
            print(text, flush=True, file=sys.stdout)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class RateMeter:
    """Rate of a cumulative counter between successive `rate()` calls."""

    def __init__(self, value: float = 0.0):
        self._t = time.perf_counter()
        self._v = value

    def rate(self, value: float) -> float:
        now = time.perf_counter()
        dt = now - self._t
        r = (value - self._v) / dt if dt > 0 else 0.0
        self._t, self._v = now, value
        return r
