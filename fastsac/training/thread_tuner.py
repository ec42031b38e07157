"""Intra-op threads that stay fast on a shared machine: the update's thread count is measured,
not assumed.

A torch update with one intra-op thread per CPU is fastest on a quiet machine, and slowest by
far when anything else runs on one of those CPUs: every parallel op waits for the thread whose
core is taken (measured on 2 cores: 72 updates/s quiet, 21 beside one busy process; with one
thread 54 quiet and 63 beside it). Whoever shares the machine can come and go at any time, so
the tuner keeps measuring: it times the updates at the current count for TRIAL_S, then at the
other one (one thread fewer, or back to all) for TRIAL_S, keeps whichever did the update faster
(by GAIN), and compares again every EXPLORE_EVERY_S, or at once when the updates at the kept
count have become SLOWDOWN times slower (a neighbour arrived). On a quiet machine that costs the
updates of one trial second per minute run one thread short (under 0.5% of the time).
"""
from __future__ import annotations

import time
from typing import Callable

TRIAL_S = 1.0           # each measurement: the current count, then the other
EXPLORE_EVERY_S = 60.0  # between two comparisons
GAIN = 1.05             # the other count must be this much faster to be taken
SLOWDOWN = 1.5          # kept count this much slower than when it was chosen: compare again now


class ThreadTuner:
    def __init__(self, max_threads: int, set_threads: Callable[[int], None], clock=time.perf_counter,
                 log: Callable[[str], None] | None = None, fewest: int | None = None):
        """Compares max_threads with `fewest` (default: one thread fewer)."""
        fewest = max_threads - 1 if fewest is None else fewest
        self.choices = sorted({max_threads, max(1, min(fewest, max_threads))}, reverse=True)
        self.current = max_threads
        self._set, self._clock, self._log = set_threads, clock, log
        self._set(self.current)
        self._phase = "baseline"          # baseline -> trial -> steady -> baseline ...
        self._since = clock()
        self._seconds, self._updates = 0.0, 0
        self._baseline = self._chosen = 0.0
        self._window_at = self._since
        self._trial = self.current

    @property
    def active(self) -> bool:
        return len(self.choices) > 1

    def record(self, seconds: float, updates: int) -> None:
        """After every call of the update: its duration and how many updates it ran."""
        if not self.active or updates <= 0:
            return
        now = self._clock()
        self._seconds += seconds
        self._updates += updates
        if self._phase == "steady":
            self._watch(now)
            return
        if now - self._since < TRIAL_S:
            return
        per_update = self._seconds / self._updates
        if self._phase == "baseline":
            self._baseline = per_update
            self._trial = next(c for c in self.choices if c != self.current)
            self._set(self._trial)
            self._begin("trial", now)
            return
        if per_update * GAIN < self._baseline:
            if self._log is not None:
                self._log(f"torch threads: {self.current} -> {self._trial} (an update took {per_update * 1e3:.1f} ms "
                          f"instead of {self._baseline * 1e3:.1f} ms: another process shares these CPUs, or "
                          "has stopped sharing them)")
            self.current, self._chosen = self._trial, per_update
        else:
            self._set(self.current)
            self._chosen = self._baseline
        self._begin("steady", now)
        self._window_at = now

    def _watch(self, now: float) -> None:
        """Steady: every TRIAL_S, is the kept count still as fast as when it was chosen?"""
        if now - self._since >= EXPLORE_EVERY_S:
            self._begin("baseline", now)
        elif now - self._window_at >= TRIAL_S:
            if self._seconds / self._updates > SLOWDOWN * self._chosen:
                self._begin("baseline", now)
            else:
                self._seconds, self._updates, self._window_at = 0.0, 0, now

    def _begin(self, phase: str, now: float) -> None:
        self._phase, self._since = phase, now
        self._seconds, self._updates = 0.0, 0
