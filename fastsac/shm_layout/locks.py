"""Liveness: OFD byte-range locks on the segments, and which byte each role of each segment
kind locks and where it writes its pid.

The lock and pid tables live here, below every segment kind's module, because the staleness
scan (cleanup.py) reads them for every kind while the kinds' modules use the scan.

Liveness uses OFD byte-range locks (fcntl F_OFD_SETLK) on the segment itself: the kernel
drops them when the holder dies, whatever the way it dies.
  ctl  byte 0: held by the launcher for the life of the job   -> job_is_alive()
  ring byte 0: held by the attached producer (collector)      -> one producer per ring
  ring byte 1: held by the attached consumer (learner)        -> one consumer per ring
  wts  byte 0: held by the attached writer (learner)          -> one writer per snapshot
  wts  byte 1: held by the attached reader (collector)        -> one reader per snapshot
  eval byte 0: held by the evaluator                          -> one evaluator per job
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

import numpy as np
import posix_ipc

from fastsac.shm_layout.common import CACHE_LINE, HEADER_NBYTES, SegmentKind, ctl_name

# Control lines are int64 values right after the common header, each on its own cache line.
# The lines holding a role's [pid, attached_ns, ...] are here; each kind's module owns the rest
# (ring.py: the two cursors on lines 0 and 1; snapshot.py: seq on line 0).
RING_PRODUCER_PID = HEADER_NBYTES + 2 * CACHE_LINE   # writer: producer ([pid, attached_ns])
RING_CONSUMER_PID = HEADER_NBYTES + 3 * CACHE_LINE   # writer: consumer ([pid, attached_ns])
RING_PRODUCER_LOCK, RING_CONSUMER_LOCK = 0, 1        # OFD lock bytes

WTS_WRITER_PID = HEADER_NBYTES + 1 * CACHE_LINE  # writer: learner ([pid, attached_ns, published_ns])
WTS_READER_PID = HEADER_NBYTES + 2 * CACHE_LINE  # writer: collector, the reader ([pid, attached_ns])
WTS_WRITER_LOCK, WTS_READER_LOCK = 0, 1               # OFD lock bytes: one learner, one collector

EVAL_EVALUATOR_PID = HEADER_NBYTES   # eval channel line 0, writer: the evaluator ([pid, attached_ns])
EVAL_EVALUATOR_LOCK = 0              # OFD lock byte: one evaluator per job

CTL_LAUNCHER = HEADER_NBYTES         # the control block's first record, ctl.launcher (control.py)
CTL_LAUNCHER_PID = CTL_LAUNCHER + 16  # its launcher_pid field (control.py asserts the offset)
CTL_LAUNCHER_LOCK = 0


@dataclass(frozen=True)
class RoleLock:
    role: str
    byte: int       # the OFD lock byte the role holds while attached
    pid_line: int   # offset of the int64 pid the role writes when it attaches


ROLE_LOCKS: dict[SegmentKind, tuple[RoleLock, ...]] = {
    SegmentKind.CTL: (RoleLock("launcher", CTL_LAUNCHER_LOCK, CTL_LAUNCHER_PID),),
    SegmentKind.RING: (RoleLock("producer", RING_PRODUCER_LOCK, RING_PRODUCER_PID),
                       RoleLock("consumer", RING_CONSUMER_LOCK, RING_CONSUMER_PID)),
    SegmentKind.WTS: (RoleLock("writer", WTS_WRITER_LOCK, WTS_WRITER_PID),
                      RoleLock("reader", WTS_READER_LOCK, WTS_READER_PID)),
    SegmentKind.EVAL: (RoleLock("evaluator", EVAL_EVALUATOR_LOCK, EVAL_EVALUATOR_PID),),
}


def read_pid(u8: np.ndarray, line: int) -> int:
    """The int64 pid a role wrote at `line` of a mapped segment."""
    return int(u8[line:line + 8].view(np.int64)[0])


# --------------------------------------------------------------------------- OFD locks

_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64: type, whence, start, len, pid (+pad)


def _lock_byte(fd: int, byte: int) -> bool:
    """Try to take an exclusive OFD lock on one byte; False if another open file holds it.

    OFD locks belong to the open file description: two opens in one process conflict
    (unlike classic POSIX locks), and closing an unrelated fd does not drop them.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _unlock_byte(fd: int, byte: int) -> None:
    # Explicit unlock matters: the mmap keeps the open file alive after os.close(fd),
    # and an OFD lock lives as long as the open file.
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, byte, 1, 0))


def _byte_locked_by_other(fd: int, byte: int) -> bool:
    """Probe without acquiring (F_OFD_GETLK): no window in which the owner is locked out."""
    res = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
    return struct.unpack(_FLOCK, res)[0] != fcntl.F_UNLCK


def job_is_alive(job: str) -> bool:
    """True while the launcher that created /fastsac.<job>.ctl holds its lock (non-blocking probe)."""
    name = ctl_name(job)
    try:
        shm = posix_ipc.SharedMemory(name, 0)
    except posix_ipc.ExistentialError:
        return False
    try:
        return _byte_locked_by_other(shm.fd, CTL_LAUNCHER_LOCK)
    finally:
        shm.close_fd()
