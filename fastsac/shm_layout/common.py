"""What every segment kind shares: constants, segment names, the error type, the platform guard."""
from __future__ import annotations

import enum
import mmap
import os
import platform
import zlib

import numpy as np

from fastsac.config import JOB_NAME_RE

LAYOUT_VERSION = 5   # 5: the learner record says which update runs (UpdatePath); 4: the tapered actor
MAGIC = int.from_bytes(b"FASTSAC1", "little")  # written LAST at creation: 0 = not ready
SHM_DIR = "/dev/shm"
PREFIX = "fastsac"
CACHE_LINE = 64
PAGE = 4096
HEADER_NBYTES = 512          # reserved for the common header; control lines start here
DATA_OFFSET = PAGE           # bulk data (slots, weight buffers) starts page-aligned
MAX_COLLECTORS = 64
EVALUATOR_ID = -2            # the evaluator's weight snapshot: a WTS segment of no collector (/fastsac.J.eval.wts)
# learner records in the control block: every learner has a collector of its own, so never more
# learners than collectors (config.py checks num_learners <= num_collectors, the plan the collector maximum)
MAX_LEARNERS = MAX_COLLECTORS
UNSAFE_ENV = "FASTSAC_UNSAFE_MEMORY_ORDER"
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14

_X86_64 = {"x86_64", "amd64"}


class ShmLayoutError(RuntimeError):
    """A segment is missing, mismatched, stale, taken, or cannot be created."""


class SegmentTaken(ShmLayoutError):
    """Another live process holds this role of a segment (a collector id that is already running):
    a usage error (exit 2), like a collector started with settings other than the job's."""


class SegmentKind(enum.IntEnum):
    CTL = 1
    RING = 2
    WTS = 3
    EVAL = 4     # the evaluator's channel: liveness and results (eval_channel.py)


def cleanup_command(job: str) -> str:
    """The one command every message recommends for removing a dead job's segments."""
    return f"fastsac-launch --cleanup {job}"


# --------------------------------------------------------------------------- names

def validate_job_name(job: str) -> str:
    if not isinstance(job, str) or not JOB_NAME_RE.match(job):
        raise ShmLayoutError(f"job name {job!r} cannot name a shared-memory segment: "
                             "use 1-32 characters from A-Z a-z 0-9 _ -")
    return job


def _check_collector_id(collector_id: int) -> int:
    if isinstance(collector_id, bool) or not isinstance(collector_id, (int, np.integer)) \
            or not 0 <= collector_id < MAX_COLLECTORS:
        raise ShmLayoutError(f"collector_id {collector_id!r} is not valid; expected an integer "
                             f"in 0..{MAX_COLLECTORS - 1}")
    return int(collector_id)


def ctl_name(job: str) -> str:
    return f"/{PREFIX}.{validate_job_name(job)}.ctl"


def ring_name(job: str, collector_id: int) -> str:
    return f"/{PREFIX}.{validate_job_name(job)}.c{_check_collector_id(collector_id)}.ring"


def wts_name(job: str, collector_id: int) -> str:
    if collector_id == EVALUATOR_ID:
        return f"/{PREFIX}.{validate_job_name(job)}.eval.wts"
    return f"/{PREFIX}.{validate_job_name(job)}.c{_check_collector_id(collector_id)}.wts"


def segment_exists(name: str) -> bool:
    """Whether /dev/shm holds a segment of this name (the learner polls for collectors' segments)."""
    return os.path.exists(_path(name))


def eval_name(job: str) -> str:
    return f"/{PREFIX}.{validate_job_name(job)}.eval"


def segment_name(kind: SegmentKind, job: str, collector_id: int = -1) -> str:
    if kind == SegmentKind.CTL:
        return ctl_name(job)
    if kind == SegmentKind.EVAL:
        return eval_name(job)
    return ring_name(job, collector_id) if kind == SegmentKind.RING else wts_name(job, collector_id)


def parse_segment_name(name: str) -> tuple[str, SegmentKind, int] | None:
    """'/fastsac.J.c3.ring' or 'fastsac.J.c3.ring' -> ('J', RING, 3); None if not ours.

    Job names cannot contain '.', so splitting on '.' is unambiguous.
    """
    parts = name.lstrip("/").split(".")
    if len(parts) < 3 or parts[0] != PREFIX or not JOB_NAME_RE.match(parts[1]):
        return None
    if len(parts) == 3 and parts[2] == "ctl":
        return parts[1], SegmentKind.CTL, -1
    if parts[2:] == ["eval"]:
        return parts[1], SegmentKind.EVAL, -1
    if parts[2:] == ["eval", "wts"]:
        return parts[1], SegmentKind.WTS, EVALUATOR_ID
    if len(parts) == 4 and parts[2][:1] == "c" and parts[2][1:].isdigit() and parts[3] in ("ring", "wts"):
        cid = int(parts[2][1:])
        if cid < MAX_COLLECTORS and parts[2] == f"c{cid}":
            return parts[1], SegmentKind.RING if parts[3] == "ring" else SegmentKind.WTS, cid
    return None


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name.lstrip("/"))


def _describe(kind: SegmentKind, job: str, collector_id: int) -> str:
    """How error messages name a segment: 'ring of collector 1'."""
    if kind == SegmentKind.CTL:
        return f"control block of job {job!r}"
    if kind == SegmentKind.EVAL or collector_id == EVALUATOR_ID:
        return f"{'channel' if kind == SegmentKind.EVAL else 'weight snapshot'} of the evaluator"
    return f"{'ring' if kind == SegmentKind.RING else 'weight snapshot'} of collector {collector_id}"


# --------------------------------------------------------------------------- platform

def check_memory_order() -> None:
    """Refuse to run where plain stores/loads do not give release/acquire order.

    x86-64 is TSO: stores are not reordered with older stores, loads not with older
    loads, and loads not with younger stores. CPython executes a numpy copy and the
    following int64 store in program order (an opaque C call is a compiler barrier),
    so "data, then cursor" is visible in that order to another core. ARM64 / POWER
    reorder freely: they need acquire/release atomics this module does not have.
    """
    machine = platform.machine()
    if machine.lower() in _X86_64:
        return
    if os.environ.get(UNSAFE_ENV) == "1":
        return
    raise ShmLayoutError(
        f"refusing to run: the lock-free ring relies on x86-64 TSO; {machine or 'this machine'} needs "
        f"acquire/release atomics (set {UNSAFE_ENV}=1 to run anyway, at the risk of torn data)")


def shm_free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _digest(table: object) -> int:
    """crc32 of a segment kind's layout table (with LAYOUT_VERSION): catches code drift."""
    return zlib.crc32(repr((LAYOUT_VERSION, table)).encode())


def _align(n: int, a: int = CACHE_LINE) -> int:
    return (n + a - 1) // a * a
