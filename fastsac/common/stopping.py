"""How every process of a job learns that it should stop: one flag set by a signal.

SIGTERM and SIGINT (and SIGHUP for the launcher) only record the signal; each loop checks the
flag between steps, finishes what it is doing and stops in order (a final checkpoint, a clean
unlink). The launcher also takes the signals one by one: a second one escalates its stop.
"""
from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    def __init__(self):
        self.signum: int | None = None        # the first stop signal received
        self._unseen: list[int] = []

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> "StopSignal":
        for sig in signals:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.request(signum)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """What a signal does; tests and in-process callers stop a loop with it."""
        if self.signum is None:
            self.signum = signum
        self._unseen.append(signum)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def take(self) -> list[int]:
        """The signals received since the last take, oldest first."""
        out, self._unseen = self._unseen, []
        return out
