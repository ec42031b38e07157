"""How every process of a job learns that it should stop: one flag set by a signal.

SIGTERM and SIGINT (and SIGHUP for the launcher) only record the signal; each loop checks the
flag between steps, finishes what it is doing and stops in order (a final checkpoint, a clean
unlink). The launcher also takes the signals one by one: a second one escalates its stop.

While a process holds nothing a graceful stop would keep (a collector building its envs: a
minute for a large EnvPool pool, all inside one C call that holds a Python handler off),
`ending_at_once` gives the stop signals back their default action, so a stop ends it at once.
Before a process has its own handling, `interrupt_deferred` holds a Ctrl-C off while C++ runs
Python (torch's import), where a KeyboardInterrupt cannot unwind.
"""
from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def ending_at_once(stop: "StopSignal", signals: tuple[int, ...] = STOP_SIGNALS):
    """Inside: a stop signal ends the process at once (default action); a stop that came before
    ends it on entry. Outside: back to `stop`'s handling."""
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in signals}
    try:
        if stop.requested:
            signal.raise_signal(stop.signum)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def interrupt_deferred():
    """Inside: SIGINT only records itself; on the way out a recorded one is raised as the
    KeyboardInterrupt it would have been. Python's default SIGINT handler raises wherever the
    interpreter happens to be, and inside Python code that C++ called (torch's import runs much of
    it through pybind11) the exception escapes as a C++ `error_already_set` that aborts the process
    (`terminate called ...`) instead of unwinding. A SIGINT that is ignored (a job started in the
    background) or handled otherwise is left as it is."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    received = StopSignal().install((signal.SIGINT,))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if received.requested:
        raise KeyboardInterrupt


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
