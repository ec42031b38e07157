"""One run per run_dir: the launcher of a training job holds an exclusive lock on its run_dir for
the job's whole life (torch-free).

Two jobs writing into one run_dir would interleave logs/learner.log, put two TensorBoard files
in tb/ and both runs' checkpoints in checkpoints/, and `fastsac-eval RUN_DIR` would pick one of
them at random. The lock is flock(2) on RUN_DIR/.fastsac.lock: the kernel drops it when the
holder exits however it exits (kill -9 included), so a lock is never stale, and the file's
text names the holder for the refusal message. The launcher's children never inherit the
descriptor (close-on-exec), so a job's lock ends with its launcher.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from fastsac.errors import ConfigError

LOCK_NAME = ".fastsac.lock"


class RunDirLock:
    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, run_path: Path, job: str) -> "RunDirLock":
        """Lock run_path (created if needed) for this process; ConfigError naming the holder when
        another job has it."""
        run_path.mkdir(parents=True, exist_ok=True)
        path = run_path / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raw = os.pread(fd, 4096, 0)
            os.close(fd)
            raise _in_use(run_path, raw) from None
        record = {"job": job, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        return cls(path, fd)

    @staticmethod
    def check_free(run_path: Path) -> None:
        """ConfigError naming the holder when another job holds run_path; creates nothing (the
        launcher's pre-spawn check; the lock itself is taken once the checks passed)."""
        try:
            fd = os.open(run_path / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return                  # no lock file (or no run_dir): nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(run_path, os.pread(fd, 4096, 0)) from None
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)      # drops the flock; the file stays (harmless, rewritten by the next holder)
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _in_use(run_path: Path, raw: bytes) -> ConfigError:
    return ConfigError(f"run_dir: {str(run_path)!r} is in use by {_describe(raw)}; two jobs in one run_dir would mix "
                       "their logs, TensorBoard files and checkpoints. Wait for that job or stop it, or give this one "
                       "another run_dir")


def _describe(raw: bytes) -> str:
    try:
        r = json.loads(raw.decode())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["since"]))
        return f"job {r['job']!r} (pid {r['pid']} on {r['host']}, since {since})"
    except (ValueError, KeyError, TypeError):
        return "another job (its lock file names no holder yet)"
