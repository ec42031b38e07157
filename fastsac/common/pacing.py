"""Waiting without spinning, and staying alive while waiting: the backoff schedules and the
background heartbeat every process uses, with their constants in this one place.

* IdleBackoff: nothing to do (a full ring, empty rings): sleep from 50 µs, doubling to 2 ms,
  back to 0 when work arrives. Spinning, or a fixed short sleep, costs a Python loop iteration
  each time (measured: ~50% of a core, taken from collectors sharing the learner's CPUs); 2 ms is
  far below the time one env-step batch takes to produce.
* restart_delay: a crashed process is restarted after restart_backoff_s, doubling per restart.
* BackgroundBeat: slow but live work (a checkpoint of large networks on a slow disk, a wait in a
  collective) keeps its process's heartbeat fresh from a helper thread, so the supervisor does
  not take it for hung. The heartbeat field keeps its one writer: the main thread does not
  beat while it is covered.
"""
from __future__ import annotations

import contextlib
import threading
import time

IDLE_SLEEP_MIN_S, IDLE_SLEEP_MAX_S = 50e-6, 2e-3


class IdleBackoff:
    def __init__(self):
        self.sleep_s = 0.0

    def wait(self) -> None:
        """Nothing to do this time: sleep the next step of the schedule."""
        self.sleep_s = min(max(self.sleep_s * 2, IDLE_SLEEP_MIN_S), IDLE_SLEEP_MAX_S)
        time.sleep(self.sleep_s)

    def reset(self) -> None:
        """Work arrived: the next idle wait starts short again."""
        self.sleep_s = 0.0


def restart_delay(restart_backoff_s: float, restarts: int) -> float:
    """Seconds before restart number restarts + 1 of a crashed process."""
    return restart_backoff_s * (2 ** restarts)


def beat_period(heartbeat_timeout_s: float) -> float:
    """How often a background beat writes: four beats per timeout, at most 1 s, at least 50 ms apart."""
    return max(min(heartbeat_timeout_s / 4, 1.0), 0.05)


class BackgroundBeat:
    """A helper thread that writes record["heartbeat_ns"] while the main thread is covered."""

    def __init__(self, record, period_s: float):
        self.record, self.period_s = record, period_s
        self.active = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.period_s):
            if self.active:
                self.record["heartbeat_ns"] = time.monotonic_ns()

    @contextlib.contextmanager
    def covering(self):
        """The body's time counts as alive (beaten every period_s from the helper thread)."""
        self.record["heartbeat_ns"] = time.monotonic_ns()
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def close(self) -> None:
        self.done.set()
        self.thread.join()


@contextlib.contextmanager
def beating_while(record, heartbeat_timeout_s: float):
    """One covered stretch of slow work, with a helper thread of its own."""
    beat = BackgroundBeat(record, beat_period(heartbeat_timeout_s))
    try:
        with beat.covering():
            yield
    finally:
        beat.close()
