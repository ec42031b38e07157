"""How every process of a job learns that it should stop: one flag set by a signal.

SIGTERM, SIGINT and SIGHUP (STOP_SIGNALS: the ones docs/operations.md promises a graceful stop
for; SIGHUP is what a dropped ssh session sends) only record the signal; each loop checks the
flag between steps, finishes what it is doing and stops in order (a final checkpoint, a clean
unlink). Every process and both trainers install this one set. The launcher also takes the
signals one by one: a second one escalates its stop.

While a process holds nothing a graceful stop would keep (a collector building its envs: a
minute for a large EnvPool pool, all inside one C call that holds a Python handler off),
`ending_at_once` gives the stop signals back their default action, so a stop ends it at once.
Before the launcher has its job's handling, `raise_on_stop_signals` makes every stop signal raise
(`Interrupted`, as Python's own SIGINT handler raises KeyboardInterrupt) so that SIGTERM and
SIGHUP end it with the same one line and exit code as a Ctrl-C instead of killing it silently;
`interrupt_deferred` holds them off while C++ runs Python (torch's import), where an exception
cannot unwind.
"""
from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal that arrived before the process had its own handling (start-up)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum    # the shell's convention: 130 for SIGINT, 143 SIGTERM, 129 SIGHUP

    @property
    def what(self) -> str:
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def _raises(handler) -> bool:
    return handler is signal.default_int_handler or handler is _raise_interrupted


def raise_on_stop_signals() -> None:
    """Every stop signal with its default action (death, for SIGTERM and SIGHUP) raises Interrupted
    instead, so that start-up unwinds (finally blocks remove what was created) and says so. A
    signal that is ignored (SIGHUP under nohup, SIGINT of a background job) stays ignored."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, _raise_interrupted)


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
    """Inside: a stop signal whose handler raises (Python's default SIGINT handler, or
    raise_on_stop_signals') only records itself; on the way out a recorded one is raised as the
    exception it would have been. Such a handler raises wherever the interpreter happens to be, and
    inside Python code that C++ called (torch's import runs much of it through pybind11) the
    exception escapes as a C++ `error_already_set` that aborts the process (`terminate called ...`)
    instead of unwinding. A signal that is ignored (a job started in the background) or handled
    otherwise is left as it is."""
    raising = {sig: handler for sig in STOP_SIGNALS if _raises(handler := signal.getsignal(sig))}
    received = StopSignal().install(tuple(raising))
    try:
        yield
    finally:
        for sig, handler in raising.items():
            signal.signal(sig, handler)
    if received.requested:
        raise KeyboardInterrupt if raising[received.signum] is signal.default_int_handler \
            else Interrupted(received.signum)


class StopSignal:
    def __init__(self):
        self.signum: int | None = None        # the first stop signal received
        self._unseen: list[int] = []

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> "StopSignal":
        for sig in signals:
            # an ignored SIGHUP is `nohup`'s promise that the terminal going away changes nothing
            if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:
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
