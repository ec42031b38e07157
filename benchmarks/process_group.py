"""The processes a benchmark starts: each in a session of its own, and stopped with the benchmark.

A job started in its own session does not get the terminal's Ctrl-C or a `timeout`'s SIGTERM
that the benchmark gets, so without this a stopped benchmark leaves its job running (seen: a
sync Humanoid run went on as an orphan for half an hour at 170% CPU and 11 GB). Here the first
SIGTERM/SIGINT/SIGHUP to the benchmark is passed on to every group it started (SIGTERM: a job
then writes its final checkpoint and unlinks its segments) and the benchmark exits 128 + the
signal; at its exit, however it ends, every group still running gets SIGTERM, up to
STOP_GRACE_S to end, then SIGKILL. The waiting happens at exit, not in the signal handler: the
handler may interrupt a wait on the same process, whose lock a second wait would deadlock on.
Every benchmark starts its children through `CHILDREN`.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess

STOP_GRACE_S = 30.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Children:
    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self._installed = False

    def _install(self) -> None:
        if not self._installed:
            self._installed = True
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_stop_signal)
            atexit.register(self.stop_all)

    def start(self, cmd: list[str], **popen_kwargs) -> subprocess.Popen:
        self._install()
        proc = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
        self.procs.append(proc)
        return proc

    def send(self, proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> int:
        """Signal its group, wait up to grace_s, SIGKILL the group after that; its exit code."""
        if proc.poll() is None:
            self.send(proc, sig)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.send(proc, signal.SIGKILL)
                proc.wait()
        self.send(proc, signal.SIGKILL)   # anything of its group still left (orphaned grandchildren)
        self.forget(proc)
        return proc.returncode

    def forget(self, proc: subprocess.Popen) -> None:
        if proc in self.procs:
            self.procs.remove(proc)

    def run(self, cmd: list[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(cmd, capture_output=True, text=True, timeout=...) for a whole group:
        on the timeout the group is stopped (SIGTERM, then SIGKILL) and TimeoutExpired raised."""
        proc = self.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc, grace_s=10.0)
            raise
        self.forget(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def stop_all(self) -> None:
        """Every group still running: SIGTERM to all at once, then each is waited for (SIGKILL
        after STOP_GRACE_S). Runs at exit; a further stop signal meanwhile changes nothing."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        for proc in list(self.procs):
            if proc.poll() is None:
                self.send(proc, signal.SIGTERM)
        for proc in list(self.procs):
            self.stop(proc, signal.SIGTERM, STOP_GRACE_S)

    def _on_stop_signal(self, signum, frame):
        for proc in list(self.procs):
            self.send(proc, signal.SIGTERM)     # at once; stop_all waits for them at exit
        raise SystemExit(128 + signum)


CHILDREN = Children()
