"""Every shared-memory segment of a fastsac job: names, headers, offsets, dtypes.

This module is the single source of truth for the shared-memory layout. Nothing else
computes an offset into a segment. Torch-free on purpose (the launcher and the NUMA
check mode import it): numpy views over the mappings are enough; the learner wraps them
with torch.from_numpy.

Segments of job J (POSIX shared memory, /dev/shm/<name without the slash>):

  /fastsac.J.ctl       control block: created by the launcher (one per job)
  /fastsac.J.c<i>.ring SPSC transition ring of collector i: created by collector i
  /fastsac.J.c<i>.wts  seqlock double-buffered actor snapshot of collector i: created by
                       collector i (first touch under its NUMA binding), written by the learner

Rules that make the whole thing lock-free (argued in docs/design.md, "Shared memory"):
  * every shared field has exactly one writer process (stated next to each field below);
  * cursors and sequence counters are aligned int64, each on its own 64-byte line;
  * data is written before the counter that publishes it, and read after the counter
    that announced it. On x86-64 (TSO) plain stores/loads give that order; see
    `check_memory_order`.

Liveness uses OFD byte-range locks (fcntl F_OFD_SETLK) on the segment itself: the kernel
drops them when the holder dies, whatever the way it dies.
  ctl  byte 0: held by the launcher for the life of the job   -> job_is_alive()
  ring byte 0: held by the attached producer (collector)      -> one producer per ring
  ring byte 1: held by the attached consumer (learner)        -> one consumer per ring
  wts  byte 0: held by the attached writer (learner)          -> one writer per snapshot
  wts  byte 1: held by the attached reader (collector)        -> one reader per snapshot
"""
from __future__ import annotations

import enum
import errno
import fcntl
import functools
import json
import mmap
import os
import platform
import secrets
import stat
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import posix_ipc

from fastsac.config import JOB_NAME_RE

# --------------------------------------------------------------------------- constants

LAYOUT_VERSION = 2
MAGIC = int.from_bytes(b"FASTSAC1", "little")  # written LAST at creation: 0 = not ready
SHM_DIR = "/dev/shm"
PREFIX = "fastsac"
CACHE_LINE = 64
PAGE = 4096
HEADER_NBYTES = 512          # reserved for the common header; control lines start here
DATA_OFFSET = PAGE           # bulk data (slots, weight buffers) starts page-aligned
MAX_COLLECTORS = 64
UNSAFE_ENV = "FASTSAC_UNSAFE_MEMORY_ORDER"
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14

_X86_64 = {"x86_64", "amd64"}


class ShmLayoutError(RuntimeError):
    """A segment is missing, mismatched, stale, taken, or cannot be created."""


class SegmentKind(enum.IntEnum):
    CTL = 1
    RING = 2
    WTS = 3


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
    return f"/{PREFIX}.{validate_job_name(job)}.c{_check_collector_id(collector_id)}.wts"


def segment_exists(name: str) -> bool:
    """Whether /dev/shm holds a segment of this name (the learner polls for collectors' segments)."""
    return os.path.exists(_path(name))


def segment_name(kind: SegmentKind, job: str, collector_id: int = -1) -> str:
    if kind == SegmentKind.CTL:
        return ctl_name(job)
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


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shm_free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


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


# --------------------------------------------------------------------------- common header

# Written once by the creator of the segment (magic last), read-only afterwards.
HEADER_DTYPE = np.dtype([
    ("magic", "<u8"),            # MAGIC once the segment is fully initialized
    ("layout_version", "<i8"),   # LAYOUT_VERSION of the creator
    ("kind", "<i8"),             # SegmentKind
    ("collector_id", "<i8"),     # -1 for the control block
    ("incarnation", "<u8"),      # job incarnation: random 64-bit chosen by the ctl creator
    ("creator_pid", "<i8"),
    ("created_ns", "<i8"),       # time.time_ns() (wall clock, for humans)
    ("total_nbytes", "<i8"),     # segment size
    ("job", "S32"),
    ("boot_id", "S40"),          # /proc/sys/kernel/random/boot_id of the creator
    ("dtype", "S8"),             # element dtype of float payloads ('float32')
    ("params", "<i8", (8,)),     # kind-specific dimensions, named by PARAM_NAMES[kind]
    ("layout_digest", "<u8"),    # crc32 of the full layout table (catches code drift)
])
assert HEADER_DTYPE.itemsize <= HEADER_NBYTES

PARAM_NAMES: dict[SegmentKind, tuple[str, ...]] = {
    SegmentKind.CTL: ("num_collectors", "max_collectors"),
    SegmentKind.RING: ("num_envs", "obs_dim", "critic_obs_dim", "act_dim", "capacity",
                       "slot_nbytes", "dense_nbytes"),
    SegmentKind.WTS: ("numel", "buffer_stride"),
}


@dataclass(frozen=True)
class SegmentInfo:
    """What a caller expects of a segment; compared field by field against its header."""
    kind: SegmentKind
    job: str
    collector_id: int
    params: dict[str, int]
    dtype: str
    total_nbytes: int
    layout_digest: int

    @property
    def name(self) -> str:
        return segment_name(self.kind, self.job, self.collector_id)

    @property
    def what(self) -> str:
        return _describe(self.kind, self.job, self.collector_id)


def _digest(table: object) -> int:
    return zlib.crc32(repr((LAYOUT_VERSION, table)).encode())


def _align(n: int, a: int = CACHE_LINE) -> int:
    return (n + a - 1) // a * a


# --------------------------------------------------------------------------- raw segment

class _Segment:
    """One mapped POSIX segment: fd + mmap + uint8 view + header view + held locks."""

    def __init__(self, name: str, shm: posix_ipc.SharedMemory, nbytes: int):
        self.name = name
        self.fd = shm.fd
        self.nbytes = nbytes
        self.inode = os.fstat(self.fd).st_ino
        self.mm = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.u8 = np.frombuffer(self.mm, dtype=np.uint8)
        # 0-d array, not np.void: field reads must go to memory every time.
        self.header = (self.u8[:HEADER_DTYPE.itemsize].view(HEADER_DTYPE).reshape(())
                       if nbytes >= HEADER_NBYTES else None)
        self._shm = shm
        self.locks: set[int] = set()

    # ---- creation

    @classmethod
    def create(cls, info: SegmentInfo, incarnation: int, lock_byte: int | None,
               init: "Callable[[_Segment], None] | None" = None) -> "_Segment":
        """shm_open(O_EXCL) -> lock -> reserve (fallocate) -> map -> pre-fault -> init(seg) -> header,
        magic last (so what init writes is in place before anyone can attach)."""
        name, nbytes = info.name, info.total_nbytes
        free = shm_free_bytes()
        if nbytes > free:  # fail before touching anything (a partial fallocate would squeeze others)
            raise _no_space(info, nbytes, free)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
        except posix_ipc.ExistentialError:
            raise ShmLayoutError(f"{info.what}: segment {name} already exists") from None
        seg = None
        try:
            if lock_byte is not None and not _lock_byte(shm.fd, lock_byte):
                raise ShmLayoutError(f"{info.what}: segment {name} was locked by another process "
                                     "right after creation")
            _reserve(shm.fd, info, nbytes)
            seg = cls(name, shm, nbytes)
            if lock_byte is not None:
                seg.locks.add(lock_byte)
            # The pages were allocated by fallocate under this process's memory policy (tmpfs
            # allocates at fallocate time): that is the first touch deciding NUMA placement.
            # Pre-fault the page tables too, so the first pass does not run at page-fault speed.
            seg.prefault(zero_fallback=True)
            if init is not None:
                init(seg)
            seg._write_header(info, incarnation)
        except BaseException:
            _unlink_quiet(name)
            if seg is not None:
                seg.close()
            else:
                shm.close_fd()
            raise
        return seg

    def _write_header(self, info: SegmentInfo, incarnation: int) -> None:
        h = self.header
        h["layout_version"] = LAYOUT_VERSION
        h["kind"] = int(info.kind)
        h["collector_id"] = info.collector_id
        h["incarnation"] = np.uint64(incarnation)
        h["creator_pid"] = os.getpid()
        h["created_ns"] = time.time_ns()
        h["total_nbytes"] = self.nbytes
        h["job"] = info.job.encode()
        h["boot_id"] = boot_id().encode()
        h["dtype"] = info.dtype.encode()
        params = np.zeros(8, np.int64)
        for k, pname in enumerate(PARAM_NAMES[info.kind]):
            params[k] = info.params[pname]
        h["params"] = params
        h["layout_digest"] = np.uint64(info.layout_digest)
        h["magic"] = np.uint64(MAGIC)  # last: attachers refuse a segment without it

    def prefault(self, zero_fallback: bool) -> None:
        """Map every page now. MADV_POPULATE_WRITE never changes content (safe on re-attach)."""
        try:
            # Huge pages where tmpfs allows them (mounted huge=advise|within_size): fewer TLB
            # misses on multi-MiB slot copies. Ignored under the default huge=never.
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        except (OSError, AttributeError):
            pass
        try:
            self.mm.madvise(MADV_POPULATE_WRITE)
        except OSError:
            if zero_fallback:  # kernel < 5.14: write zeros (only right for a fresh segment)
                self.u8[:] = 0

    # ---- attaching

    @classmethod
    def open_existing(cls, name: str, missing_msg: str) -> "_Segment":
        try:
            shm = posix_ipc.SharedMemory(name, 0)
        except posix_ipc.ExistentialError:
            raise ShmLayoutError(missing_msg) from None
        try:
            nbytes = os.fstat(shm.fd).st_size
            if nbytes < HEADER_NBYTES:
                raise ShmLayoutError(f"segment {name} is {nbytes} bytes: too small to be a fastsac segment "
                                     "(creation crashed, or not made by fastsac)")
            return cls(name, shm, nbytes)
        except BaseException:
            shm.close_fd()
            raise

    def header_value(self, field: str):
        v = self.header[field][()]
        if isinstance(v, bytes):
            return v.decode(errors="replace")
        return v.copy() if isinstance(v, np.ndarray) else int(v)

    def validate(self, info: SegmentInfo, incarnation: int | None = None) -> None:
        """Compare every header field with what the caller expects; precise errors."""
        h, what, name = self.header, info.what, self.name
        magic = int(h["magic"])
        if magic == 0:
            raise ShmLayoutError(f"{what}: segment {name} is not initialized: its creator (pid "
                                 f"{int(h['creator_pid'])}) is still creating it or died while creating it")
        if magic != MAGIC:
            raise ShmLayoutError(f"{what}: segment {name} is not a fastsac segment (magic {magic:#x})")
        if int(h["layout_version"]) != LAYOUT_VERSION:
            raise ShmLayoutError(f"{what}: layout version is {int(h['layout_version'])} in the segment but "
                                 f"{LAYOUT_VERSION} in this fastsac: it was made by a different fastsac version")
        if int(h["kind"]) != info.kind:
            raise ShmLayoutError(f"{what}: segment {name} has kind {int(h['kind'])}, expected {int(info.kind)} "
                                 f"({info.kind.name})")
        job = self.header_value("job")
        if job != info.job:
            raise ShmLayoutError(f"{what}: job is {job!r} in the segment but {info.job!r} in the config")
        if int(h["collector_id"]) != info.collector_id:
            raise ShmLayoutError(f"{what}: collector_id is {int(h['collector_id'])} in the segment but "
                                 f"{info.collector_id} was expected")
        seg_boot = self.header_value("boot_id")
        if seg_boot != boot_id():
            raise ShmLayoutError(f"{what}: segment {name} was created before the last reboot (boot id "
                                 f"{seg_boot!r}, now {boot_id()!r}): it is stale; {_remove_hint(info.job)}")
        params = h["params"]
        for k, pname in enumerate(PARAM_NAMES[info.kind]):
            if int(params[k]) != info.params[pname]:
                raise ShmLayoutError(f"{what}: {pname} is {int(params[k])} in the segment but "
                                     f"{info.params[pname]} in the config")
        dtype = self.header_value("dtype")
        if dtype != info.dtype:
            raise ShmLayoutError(f"{what}: dtype is {dtype!r} in the segment but {info.dtype!r} in the config")
        if int(h["total_nbytes"]) != info.total_nbytes or self.nbytes != info.total_nbytes:
            raise ShmLayoutError(f"{what}: size is {int(h['total_nbytes'])} bytes in the header and {self.nbytes} "
                                 f"on disk but {info.total_nbytes} for the config")
        if int(h["layout_digest"]) != info.layout_digest:
            raise ShmLayoutError(f"{what}: layout digest is {int(h['layout_digest']):#x} in the segment but "
                                 f"{info.layout_digest:#x} here: it was made by a different fastsac version")
        if incarnation is not None and int(h["incarnation"]) != (incarnation & (2**64 - 1)):
            raise ShmLayoutError(f"{what}: belongs to job incarnation {int(h['incarnation']):#x} but the running "
                                 f"job is incarnation {incarnation & (2**64 - 1):#x}: it is left over from an "
                                 f"earlier launch; {_remove_hint(info.job)}")
        created = int(h["created_ns"])
        if created <= 0 or int(h["creator_pid"]) <= 0:
            raise ShmLayoutError(f"{what}: header of {name} is corrupt (creator pid {int(h['creator_pid'])}, "
                                 f"created_ns {created})")

    # ---- locks / lifetime

    def try_lock(self, byte: int) -> bool:
        if byte in self.locks:
            return True
        if _lock_byte(self.fd, byte):
            self.locks.add(byte)
            return True
        return False

    def locked_by_other(self, byte: int) -> bool:
        return byte not in self.locks and _byte_locked_by_other(self.fd, byte)

    def still_named(self) -> bool:
        """True while the name still refers to the file this process mapped."""
        try:
            return os.stat(_path(self.name)).st_ino == self.inode
        except FileNotFoundError:
            return False

    def unlink(self) -> bool:
        """Remove the name, but only if it still refers to *our* file (never a successor's)."""
        if not self.still_named():
            return False
        return _unlink_quiet(self.name)

    def close(self) -> None:
        if self.fd < 0:
            return
        for byte in sorted(self.locks):
            _unlock_byte(self.fd, byte)
        self.locks.clear()
        self.header = None
        self.u8 = None
        try:
            self.mm.close()
        except BufferError:
            pass  # the caller still holds views: the mapping lives on until they are dropped
        self._shm.close_fd()
        self.fd = -1


def _unlink_quiet(name: str) -> bool:
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def _remove_hint(job: str) -> str:
    return f"remove it with: python -m fastsac.shm_layout clean --job {job}"


def _no_space(info: SegmentInfo, needed: int, free: int) -> ShmLayoutError:
    return ShmLayoutError(
        f"{info.what}: not enough shared memory for {info.name}: needs {needed:,} bytes ({_mb(needed)}) but "
        f"{SHM_DIR} has {free:,} bytes ({_mb(free)}) free; free space in {SHM_DIR}, shrink the ring "
        f"(capacity / num_envs), or give the container more (docker run --shm-size=...)")


def _reserve(fd: int, info: SegmentInfo, nbytes: int) -> None:
    """Allocate every byte now: ENOSPC here is an error message, later it would be a SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise _no_space(info, nbytes, shm_free_bytes()) from None
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # not tmpfs: size it; the pre-check guarded space
            os.ftruncate(fd, nbytes)
            return
        raise


# --------------------------------------------------------------------------- ring layout

SLOT_HEADER_FIELDS = ("weight_version", "env_step", "num_final", "incarnation", "produced_ns", "seq")
SLOT_HEADER_NBYTES = CACHE_LINE  # int64[8]; unused entries reserved
HDR = {name: i for i, name in enumerate(SLOT_HEADER_FIELDS)}  # index of each header value


def staged_headers(dense: np.ndarray, k: int) -> np.ndarray:
    """int64 [k, 8] view of the slot headers of the first k rows copied out by copy_out()
    (columns: HDR[name])."""
    return dense[:k, :SLOT_HEADER_NBYTES].view(np.int64)

# Ring control lines (offsets in the segment). One int64 each, each on its own cache line.
RING_WRITE_CURSOR = HEADER_NBYTES + 0 * CACHE_LINE   # writer: producer (collector)
RING_READ_CURSOR = HEADER_NBYTES + 1 * CACHE_LINE    # writer: consumer (learner)
RING_PRODUCER_PID = HEADER_NBYTES + 2 * CACHE_LINE   # writer: producer ([pid, attached_ns])
RING_CONSUMER_PID = HEADER_NBYTES + 3 * CACHE_LINE   # writer: consumer ([pid, attached_ns])
RING_PRODUCER_LOCK, RING_CONSUMER_LOCK = 0, 1        # OFD lock bytes


@dataclass(frozen=True)
class SlotField:
    name: str
    offset: int            # bytes from the start of the slot (64-aligned)
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class RingSpec:
    """Shape of one collector's ring. A slot holds one env-step batch of the collector's envs.

    Slot layout (every field 64-byte aligned; dense fields first, sparse last):
      header   int64[8]  weight_version, env_step, num_final, incarnation, produced_ns, seq
      obs      f32[N, obs_dim]         observation acted on at this step
      critic_obs f32[N, cdim]          only when cdim > 0
      actions  f32[N, act_dim]
      rewards  f32[N]
      terminated u8[N], truncated u8[N]
      --- dense_nbytes: everything above is always valid; below only the first num_final rows
      final_idx  i64[N]                env index of each episode that ended at this step
      final_obs  f32[N, obs_dim]       its true final observation (the slot's successor holds
      final_critic_obs f32[N, cdim]    the reset observation instead)
    Next observations are not stored: obs of the successor slot, or final_obs for ended envs.
    """
    num_envs: int
    obs_dim: int
    critic_obs_dim: int
    act_dim: int
    capacity: int

    def __post_init__(self):
        for f in ("num_envs", "obs_dim", "act_dim", "capacity"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ShmLayoutError(f"RingSpec.{f}: {v!r} is not valid; expected an integer >= 1")
        v = self.critic_obs_dim
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ShmLayoutError(f"RingSpec.critic_obs_dim: {v!r} is not valid; expected an integer >= 0 (0 = none)")

    @functools.cached_property
    def _fields(self) -> tuple[tuple[SlotField, ...], int, int]:
        n, f32 = self.num_envs, np.dtype(np.float32)
        dense = [("header", np.dtype(np.int64), (SLOT_HEADER_NBYTES // 8,)),
                 ("obs", f32, (n, self.obs_dim))]
        if self.critic_obs_dim:
            dense.append(("critic_obs", f32, (n, self.critic_obs_dim)))
        dense += [("actions", f32, (n, self.act_dim)), ("rewards", f32, (n,)),
                  ("terminated", np.dtype(np.uint8), (n,)), ("truncated", np.dtype(np.uint8), (n,))]
        sparse = [("final_idx", np.dtype(np.int64), (n,)), ("final_obs", f32, (n, self.obs_dim))]
        if self.critic_obs_dim:
            sparse.append(("final_critic_obs", f32, (n, self.critic_obs_dim)))
        out, off, dense_nbytes = [], 0, 0
        for group in (dense, sparse):
            for name, dt, shape in group:
                fld = SlotField(name, off, dt, shape)
                out.append(fld)
                off = _align(off + fld.nbytes)
            if group is dense:
                dense_nbytes = off
        return tuple(out), off, dense_nbytes

    def slot_fields(self) -> tuple[SlotField, ...]:
        """(name, offset within slot, dtype, shape) of every field, in memory order."""
        return self._fields[0]

    @property
    def slot_nbytes(self) -> int:
        return self._fields[1]

    @property
    def dense_nbytes(self) -> int:
        """Bytes at the start of a slot that are always valid (header .. truncated)."""
        return self._fields[2]

    @property
    def segment_nbytes(self) -> int:
        return DATA_OFFSET + self.capacity * self.slot_nbytes

    def field(self, name: str) -> SlotField:
        for f in self.slot_fields():
            if f.name == name:
                return f
        raise KeyError(name)

    @functools.cached_property
    def _sparse_fields(self) -> tuple[tuple[SlotField, int], ...]:
        """(field, bytes per env row) of the fields after dense_nbytes (final_idx, final_obs, ...)."""
        return tuple((f, f.nbytes // self.num_envs) for f in self.slot_fields() if f.offset >= self.dense_nbytes)

    def final_rows_layout(self, num_final: int) -> tuple[tuple[SlotField, int, int], ...]:
        """How copy_out packs a slot's first num_final rows of each sparse field: (field, offset in the
        packed piece, bytes), each 64-byte aligned. The piece's size is final_rows_nbytes(num_final)."""
        out, off = [], 0
        for f, row in self._sparse_fields:
            out.append((f, off, num_final * row))
            off = _align(off + num_final * row)
        return tuple(out)

    def final_rows_nbytes(self, num_final: int) -> int:
        return sum(_align(num_final * row) for _, row in self._sparse_fields)

    def slot_dtype(self) -> np.dtype:
        """A numpy structured dtype with the slot's exact layout (itemsize == slot_nbytes)."""
        fs = self.slot_fields()
        return np.dtype({"names": [f.name for f in fs], "formats": [(f.dtype, f.shape) for f in fs],
                         "offsets": [f.offset for f in fs], "itemsize": self.slot_nbytes})

    def transition_nbytes(self) -> int:
        """Dense bytes per env per step (what the ring moves per env-step, finals aside)."""
        return (self.dense_nbytes - SLOT_HEADER_NBYTES) // self.num_envs

    def segment_info(self, job: str, collector_id: int) -> SegmentInfo:
        table = (tuple((f.name, f.offset, f.dtype.str, f.shape) for f in self.slot_fields()),
                 RING_WRITE_CURSOR, RING_READ_CURSOR, RING_PRODUCER_PID, RING_CONSUMER_PID, DATA_OFFSET)
        params = {"num_envs": self.num_envs, "obs_dim": self.obs_dim, "critic_obs_dim": self.critic_obs_dim,
                  "act_dim": self.act_dim, "capacity": self.capacity, "slot_nbytes": self.slot_nbytes,
                  "dense_nbytes": self.dense_nbytes}
        return SegmentInfo(SegmentKind.RING, validate_job_name(job), _check_collector_id(collector_id), params,
                           "float32", self.segment_nbytes, _digest(table))


class SlotView:
    """Zero-copy numpy views of one ring slot; built once per slot at attach.

    Valid while the ring is attached. A consumer must copy what it needs before release().
    """
    __slots__ = ("index", "raw", "obs", "critic_obs", "actions", "rewards", "terminated", "truncated",
                 "final_idx", "final_obs", "final_critic_obs", "_h")

    def __init__(self, index: int, raw: np.ndarray, spec: RingSpec):
        self.index = index
        self.raw = raw  # uint8[slot_nbytes]
        views = {f.name: raw[f.offset:f.offset + f.nbytes].view(f.dtype).reshape(f.shape)
                 for f in spec.slot_fields()}
        self._h = views.pop("header")
        self.critic_obs = self.final_critic_obs = None
        for name, v in views.items():
            setattr(self, name, v)

    def _get(i):  # noqa: N805 - property factory
        return property(lambda self: int(self._h[i]), lambda self, v: self._h.__setitem__(i, v))

    weight_version = _get(0)   # actor version the actions were sampled with (producer)
    env_step = _get(1)         # collector-local env-step batch counter (producer)
    num_final = _get(2)        # rows valid in final_idx / final_obs / final_critic_obs
    incarnation = _get(3)      # collector incarnation (restart counter) that produced the slot
    produced_ns = _get(4)      # time.monotonic_ns() at commit
    seq = _get(5)              # write-cursor value of this slot (set by commit)
    del _get


class _SegmentHandle:
    """What every attached segment handle offers: its name, unlink, and `with` support."""
    _seg: "_Segment"

    def close(self) -> None:
        raise NotImplementedError

    def unlink(self) -> bool:
        return self._seg.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def name(self) -> str:
        return self._seg.name


class TransitionRing(_SegmentHandle):
    """SPSC ring of env-step batches: collector i produces, the learner consumes.

    Writers: slot contents + write cursor + producer pid: the producer; read cursor +
    consumer pid: the consumer. Cursors are monotonic int64 slot counts (slot = cursor %
    capacity): used = write - read, never more than capacity, so nothing is overwritten.
    """

    def __init__(self, seg: _Segment, spec: RingSpec, collector_id: int, role: str):
        self._seg, self.spec, self.collector_id, self.role = seg, spec, collector_id, role
        u8 = seg.u8
        self._wc = u8[RING_WRITE_CURSOR:RING_WRITE_CURSOR + 8].view(np.int64)
        self._rc = u8[RING_READ_CURSOR:RING_READ_CURSOR + 8].view(np.int64)
        self._ppid = u8[RING_PRODUCER_PID:RING_PRODUCER_PID + 16].view(np.int64)
        self._cpid = u8[RING_CONSUMER_PID:RING_CONSUMER_PID + 16].view(np.int64)
        sn = spec.slot_nbytes
        self._slots_u8 = u8[DATA_OFFSET:DATA_OFFSET + spec.capacity * sn].reshape(spec.capacity, sn)
        self._slots = [SlotView(i, self._slots_u8[i], spec) for i in range(spec.capacity)]
        self.incarnation = int(seg.header["incarnation"])
        # Each side caches the cursor it owns: it is the only writer of it.
        self._w = int(self._wc[0])
        self._r = int(self._rc[0])
        self._pending = False

    # ---- lifecycle

    @classmethod
    def create(cls, job: str, collector_id: int, spec: RingSpec, incarnation: int) -> "TransitionRing":
        """Create (and first-touch) the ring as its producer. Call under the collector's binding."""
        check_memory_order()
        info = spec.segment_info(job, collector_id)
        _replace_if_stale(info)
        seg = _Segment.create(info, incarnation, lock_byte=RING_PRODUCER_LOCK)
        ring = cls(seg, spec, info.collector_id, "producer")
        ring._ppid[:] = (os.getpid(), time.monotonic_ns())
        return ring

    @classmethod
    def create_or_attach(cls, job: str, collector_id: int, spec: RingSpec, incarnation: int,
                         replace: bool = False) -> "TransitionRing":
        """What a collector calls at start: re-attach its ring of this launch as producer
        (a restart: unread slots survive), else create it (replacing a stale one).

        replace=True (the learner dropped this collector's previous incarnation for a faulty
        ring): unlink the old ring, unless a live producer still holds it, and create a new one.
        """
        info = spec.segment_info(job, collector_id)
        if _incarnation_of(info.name) == incarnation & (2**64 - 1):
            if not replace:
                return cls.attach(job, collector_id, spec, "producer", incarnation)
            seg = _open_quiet(info.name)
            if seg is not None:
                try:
                    if seg.locked_by_other(RING_PRODUCER_LOCK):
                        raise ShmLayoutError(f"{info.what}: {info.name} is attached by producer pid "
                                             f"{int(seg.u8[RING_PRODUCER_PID:][:8].view(np.int64)[0])}: "
                                             f"collector_id {info.collector_id} is taken")
                finally:
                    seg.close()
            _unlink_quiet(info.name)
        return cls.create(job, collector_id, spec, incarnation)

    @classmethod
    def attach(cls, job: str, collector_id: int, spec: RingSpec, role: str = "consumer",
               incarnation: int | None = None) -> "TransitionRing":
        """Attach an existing ring. A restarted collector attaches as producer and continues
        after the last committed slot: unread data survives."""
        check_memory_order()
        if role not in ("producer", "consumer"):
            raise ShmLayoutError(f"ring role {role!r} is not valid; expected 'producer' or 'consumer'")
        info = spec.segment_info(job, collector_id)
        seg = _Segment.open_existing(info.name, f"{info.what}: segment {info.name} does not exist "
                                     f"(collector {info.collector_id} of job {job!r} has not created it)")
        try:
            seg.validate(info, incarnation)
            byte, pid_line = ((RING_PRODUCER_LOCK, RING_PRODUCER_PID) if role == "producer"
                              else (RING_CONSUMER_LOCK, RING_CONSUMER_PID))
            if not seg.try_lock(byte):
                holder = int(seg.u8[pid_line:pid_line + 8].view(np.int64)[0])
                raise ShmLayoutError(f"{info.what} already has a {role} (pid {holder}): collector_id "
                                     f"{info.collector_id} is taken" if role == "producer" else
                                     f"{info.what} already has a consumer (pid {holder})")
            # Map the pages now (never changes content), so the first pass over the ring
            # does not run at page-fault speed. Placement was decided by the creator.
            seg.prefault(zero_fallback=False)
            ring = cls(seg, spec, info.collector_id, role)
        except BaseException:
            seg.close()
            raise
        (ring._ppid if role == "producer" else ring._cpid)[:] = (os.getpid(), time.monotonic_ns())
        return ring

    def close(self) -> None:
        self._slots = []
        self._slots_u8 = self._wc = self._rc = self._ppid = self._cpid = None
        self._seg.close()

    @property
    def producer_pid(self) -> int:
        return int(self._ppid[0])

    @property
    def consumer_pid(self) -> int:
        return int(self._cpid[0])

    # ---- producer

    def _need(self, role: str) -> None:
        if self.role != role:
            raise ShmLayoutError(f"ring of collector {self.collector_id}: only the {role} may do this "
                                 f"(this handle is the {self.role})")

    def next_free_slot(self) -> SlotView | None:
        """The slot to fill in place, or None when the ring is full. Publish it with commit()."""
        self._need("producer")
        if self._w - int(self._rc[0]) >= self.spec.capacity:
            return None
        self._pending = True
        return self._slots[self._w % self.spec.capacity]

    def commit(self, produced_ns: int | None = None) -> None:
        """Publish the slot from next_free_slot(): data first, then the write cursor."""
        if not self._pending:
            raise ShmLayoutError(f"ring of collector {self.collector_id}: commit() without next_free_slot()")
        slot = self._slots[self._w % self.spec.capacity]
        nf = slot.num_final
        if not 0 <= nf <= self.spec.num_envs:
            raise ShmLayoutError(f"ring of collector {self.collector_id}: num_final {nf} is not in "
                                 f"0..{self.spec.num_envs}")
        slot.seq = self._w
        slot.produced_ns = time.monotonic_ns() if produced_ns is None else produced_ns
        self._pending = False
        self._w += 1
        # Publication point. x86-64 TSO: this store becomes visible after every store above.
        self._wc[0] = self._w

    def try_push(self, obs, critic_obs, actions, rewards, terminated, truncated, final_idx, final_obs,
                 final_critic_obs, weight_version: int, env_step: int, incarnation: int) -> bool:
        """Copy one env-step batch into the ring; False (nothing written) when full.

        final_idx: ascending env indices whose episode ended (np.flatnonzero(term | trunc)).
        final_obs / final_critic_obs: either compacted [num_final, dim] rows or the env's
        full [N, dim] arrays (rows final_idx are gathered). Only num_final rows are copied.
        """
        slot = self.next_free_slot()
        if slot is None:
            return False
        try:
            _copy(slot.obs, obs, "obs")
            if slot.critic_obs is not None:
                _copy(slot.critic_obs, critic_obs, "critic_obs")
            _copy(slot.actions, actions, "actions")
            _copy(slot.rewards, rewards, "rewards")
            _copy(slot.terminated, terminated, "terminated")
            _copy(slot.truncated, truncated, "truncated")
            nf = len(final_idx)
            if nf > self.spec.num_envs:
                raise ShmLayoutError(f"final_idx has {nf} entries but the ring has {self.spec.num_envs} envs")
            if nf:
                slot.final_idx[:nf] = final_idx
                _copy_rows(slot.final_obs, final_obs, final_idx, nf, "final_obs")
                if slot.final_critic_obs is not None:
                    _copy_rows(slot.final_critic_obs, final_critic_obs, final_idx, nf, "final_critic_obs")
            slot.num_final = nf
            slot.weight_version = weight_version
            slot.env_step = env_step
            slot.incarnation = incarnation
        except BaseException:
            self._pending = False  # nothing published; the slot is simply reused
            raise
        self.commit()
        return True

    # ---- consumer

    def available(self) -> int:
        """Committed slots not yet released (consumer view)."""
        return int(self._wc[0]) - self._r

    def peek(self, max_slots: int) -> list[SlotView]:
        """Zero-copy views of the oldest unread slots, in order (at most max_slots)."""
        self._need("consumer")
        n = min(self.available(), max_slots)
        cap, r = self.spec.capacity, self._r
        return [self._slots[(r + j) % cap] for j in range(n)]

    def peek_raw(self, max_slots: int) -> list[np.ndarray]:
        """The oldest unread slots as uint8 [k, slot_nbytes] runs (1 run, or 2 on wrap-around)."""
        self._need("consumer")
        n = min(self.available(), max_slots)
        cap, start = self.spec.capacity, self._r % self.spec.capacity
        first = min(n, cap - start)
        runs = [self._slots_u8[start:start + first]] if first else []
        if n > first:
            runs.append(self._slots_u8[:n - first])
        return runs

    def copy_out(self, dense: np.ndarray, finals: np.ndarray, max_slots: int) -> tuple[int, list[int]]:
        """Copy the oldest unread slots out of shared memory, without their reserved space.

        dense: uint8 [>= k, dense_nbytes] receives the always-valid part of each slot (header ..
        truncated) in <= 2 strided copies (two when the slots wrap around the ring's end).
        finals: flat uint8 receives, for each slot whose num_final > 0, only those rows of each
        sparse field, packed as final_rows_layout(num_final) says (usually nothing: episodes end
        rarely). Returns k and, per slot, the offset of its packed rows in finals (-1: none).
        The caller validates what it copied; nothing is released here.
        """
        self._need("consumer")
        sp = self.spec
        k = min(self.available(), max_slots, dense.shape[0])
        dn, done = sp.dense_nbytes, 0
        for run in self.peek_raw(k):
            np.copyto(dense[done:done + len(run)], run[:, :dn])
            done += len(run)
        num_final = staged_headers(dense, k)[:, HDR["num_final"]]  # from the copied headers
        offsets, pos = [], 0
        for j, slot in enumerate(self.peek(k)):
            nf = int(num_final[j])
            if not 0 < nf <= sp.num_envs:   # 0: the common case; out of range: the caller rejects it
                offsets.append(-1)
                continue
            offsets.append(pos)
            for f, off, nbytes in sp.final_rows_layout(nf):
                finals[pos + off:pos + off + nbytes] = slot.raw[f.offset:f.offset + nbytes]
            pos += sp.final_rows_nbytes(nf)
        return k, offsets

    def release(self, n: int) -> None:
        """Hand n slots back to the producer; only after their data was copied out."""
        self._need("consumer")
        if not 0 <= n <= self.available():
            raise ShmLayoutError(f"ring of collector {self.collector_id}: cannot release {n} slots, "
                                 f"{self.available()} are available")
        self._r += n
        # x86-64: our loads of the slot data are not reordered after this store.
        self._rc[0] = self._r

    # ---- both

    def fill(self) -> tuple[int, int]:
        return int(self._wc[0]) - int(self._rc[0]), self.spec.capacity

    @property
    def write_cursor(self) -> int:
        return int(self._wc[0])

    @property
    def read_cursor(self) -> int:
        return int(self._rc[0])


def _copy(dst: np.ndarray, src, name: str) -> None:
    src = np.asarray(src)
    if src.shape != dst.shape:  # np.copyto would broadcast a wrong shape silently
        raise ShmLayoutError(f"{name} has shape {src.shape}; the ring slot expects {dst.shape}")
    np.copyto(dst, src, casting="same_kind")


def _copy_rows(dst: np.ndarray, src, idx, nf: int, name: str) -> None:
    src = np.asarray(src)
    if src.shape[1:] != dst.shape[1:]:
        raise ShmLayoutError(f"{name} has shape {src.shape}; rows of {dst.shape[1:]} expected")
    if src.shape[0] == nf:  # compacted rows (when nf == N this equals gathering an ascending idx)
        np.copyto(dst[:nf], src, casting="same_kind")
    elif src.shape[0] == dst.shape[0]:
        np.take(src, np.asarray(idx), axis=0, out=dst[:nf])
    else:
        raise ShmLayoutError(f"{name} has {src.shape[0]} rows; expected num_final ({nf}) or num_envs "
                             f"({dst.shape[0]})")


# --------------------------------------------------------------------------- weight snapshot

WTS_SEQ = HEADER_NBYTES + 0 * CACHE_LINE         # writer: learner. even = stable, version = seq // 2
WTS_WRITER_PID = HEADER_NBYTES + 1 * CACHE_LINE  # writer: learner ([pid, attached_ns, published_ns])
WTS_READER_PID = HEADER_NBYTES + 2 * CACHE_LINE  # writer: collector, the reader ([pid, attached_ns])
WTS_WRITER_LOCK, WTS_READER_LOCK = 0, 1               # OFD lock bytes: one learner, one collector


def _wts_info(job: str, collector_id: int, numel: int) -> SegmentInfo:
    if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 1:
        raise ShmLayoutError(f"weight snapshot numel {numel!r} is not valid; expected an integer >= 1")
    stride = _align(int(numel) * 4, PAGE)
    table = (WTS_SEQ, WTS_WRITER_PID, WTS_READER_PID, DATA_OFFSET, "buffers=2")
    return SegmentInfo(SegmentKind.WTS, validate_job_name(job), _check_collector_id(collector_id),
                       {"numel": int(numel), "buffer_stride": stride}, "float32", DATA_OFFSET + 2 * stride,
                       _digest(table))


class WeightSnapshot(_SegmentHandle):
    """Seqlock-protected double buffer of the flat actor weights (learner -> collector i).

    publish (writer: learner only): seq -> odd, write buffer[(v) % 2] (the inactive one),
    seq -> even = 2v. Never blocks. try_load (reader: collector): copies buffer[v % 2] and
    keeps it iff seq moved by <= 2 meanwhile (the writer had not begun version v + 2, the
    next one to reuse that buffer). Never spins: a failed try returns None.
    """

    def __init__(self, seg: _Segment, collector_id: int, numel: int, role: str):
        self._seg, self.collector_id, self.numel, self.role = seg, collector_id, numel, role
        u8 = seg.u8
        stride = int(seg.header["params"][1])
        self._seq = u8[WTS_SEQ:WTS_SEQ + 8].view(np.int64)
        self._wpid = u8[WTS_WRITER_PID:WTS_WRITER_PID + 24].view(np.int64)
        self._rpid = u8[WTS_READER_PID:WTS_READER_PID + 16].view(np.int64)
        self._bufs = [u8[DATA_OFFSET + b * stride:DATA_OFFSET + b * stride + numel * 4].view(np.float32)
                      for b in (0, 1)]
        self._recheck = True       # private: False only for the negative-control test
        self.discarded = 0         # reader: copies thrown away because the writer overtook them
        self._written_seq = None   # writer: the seq it left (it is the only writer of seq)
        self.repairs = 0           # writer: publishes that found seq changed behind its back
        self.incarnation = int(seg.header["incarnation"])

    @classmethod
    def create(cls, job: str, collector_id: int, numel: int, incarnation: int,
               role: str = "reader") -> "WeightSnapshot":
        """Created (first-touched) by the collector under its binding; the learner attaches as writer."""
        check_memory_order()
        if role not in ("writer", "reader"):  # before anything exists on disk
            raise ShmLayoutError(f"weight snapshot role {role!r} is not valid; expected 'writer' or 'reader'")
        info = _wts_info(job, collector_id, numel)
        _replace_if_stale(info)
        # The creator holds its role's lock from the first instant: a half-created snapshot
        # is never mistaken for a crashed one.
        seg = _Segment.create(info, incarnation,
                              lock_byte=WTS_READER_LOCK if role == "reader" else WTS_WRITER_LOCK)
        return cls._with_role(seg, info, role)

    @classmethod
    def create_or_attach(cls, job: str, collector_id: int, numel: int, incarnation: int,
                         role: str = "reader") -> "WeightSnapshot":
        """Collector start: re-attach the snapshot of this launch (restart), else create it."""
        info = _wts_info(job, collector_id, numel)
        if _incarnation_of(info.name) == incarnation & (2**64 - 1):
            return cls.attach(job, collector_id, numel, role, incarnation)
        return cls.create(job, collector_id, numel, incarnation, role)

    @classmethod
    def attach(cls, job: str, collector_id: int, numel: int, role: str = "reader",
               incarnation: int | None = None) -> "WeightSnapshot":
        check_memory_order()
        info = _wts_info(job, collector_id, numel)
        seg = _Segment.open_existing(info.name, f"{info.what}: segment {info.name} does not exist "
                                     f"(collector {info.collector_id} of job {job!r} has not created it)")
        try:
            seg.validate(info, incarnation)
            seg.prefault(zero_fallback=False)
            return cls._with_role(seg, info, role)
        except BaseException:
            seg.close()
            raise

    @classmethod
    def _with_role(cls, seg: _Segment, info: SegmentInfo, role: str) -> "WeightSnapshot":
        if role not in ("writer", "reader"):
            seg.close()
            raise ShmLayoutError(f"weight snapshot role {role!r} is not valid; expected 'writer' or 'reader'")
        byte, line = (WTS_WRITER_LOCK, WTS_WRITER_PID) if role == "writer" else (WTS_READER_LOCK, WTS_READER_PID)
        if not seg.try_lock(byte):
            holder = int(seg.u8[line:line + 8].view(np.int64)[0])
            seg.close()
            raise ShmLayoutError(f"{info.what} already has a writer (pid {holder}): only one learner may publish"
                                 if role == "writer" else
                                 f"{info.what} already has a reader (pid {holder}): collector_id "
                                 f"{info.collector_id} is taken")
        snap = cls(seg, info.collector_id, info.params["numel"], role)
        if role == "writer":
            seq = int(snap._seq[0])
            if seq & 1:
                # The previous writer died mid-publish. Roll back to the last complete
                # version: that buffer was never touched by the unfinished publish, and a
                # reader's acceptance test (seq moved <= 2) stays sound (docs: seqlock).
                snap._seq[0] = seq - 1
            snap._written_seq = int(snap._seq[0])
            snap._wpid[:2] = (os.getpid(), time.monotonic_ns())
        else:
            snap._rpid[:] = (os.getpid(), time.monotonic_ns())
        return snap

    def close(self) -> None:
        self._bufs = []
        self._seq = self._wpid = self._rpid = None
        self._seg.close()

    @property
    def version(self) -> int:
        """Last completely published version (0 = nothing published yet)."""
        return int(self._seq[0]) // 2

    def publish(self, flat: np.ndarray) -> int:
        """Writer only. Copy flat float32 weights into the inactive buffer; returns the version."""
        if self.role != "writer":
            raise ShmLayoutError(f"weight snapshot of collector {self.collector_id}: only the writer may publish")
        if flat.dtype != np.float32 or flat.size != self.numel:
            raise ShmLayoutError(f"weight snapshot of collector {self.collector_id}: expected {self.numel} "
                                 f"float32 values, got {flat.size} {flat.dtype}")
        # The writer trusts its own copy of seq, never the shared one: a seq changed by anyone
        # else (a stray write, a corrupted bit) would otherwise stick, e.g. odd forever, and no
        # reader would ever load again. Publishing from our own value restores a consistent state.
        s = self._written_seq
        if int(self._seq[0]) != s:
            self.repairs += 1
        version = s // 2 + 1
        self._seq[0] = s + 1                       # odd: readers back off
        np.copyto(self._bufs[version & 1].reshape(flat.shape), flat)
        self._seq[0] = s + 2                       # even: version published (after the data, TSO)
        self._written_seq = s + 2
        self._wpid[2] = time.monotonic_ns()
        return version

    def try_load(self, out: np.ndarray, last_version: int) -> int | None:
        """Reader. Copy the newest version into out if it is not last_version; else None.

        Non-blocking, never loops: None also when the writer is mid-publish or overtook the copy.
        """
        if out.size != self.numel:
            raise ShmLayoutError(f"weight snapshot of collector {self.collector_id}: out has {out.size} "
                                 f"elements, the snapshot {self.numel}")
        s1 = int(self._seq[0])
        if s1 & 1:
            return None
        version = s1 >> 1
        # "!=" rather than ">": a version below ours means the writer repaired a corrupted seq
        # (see publish); taking it is what lets this reader recover.
        if version == 0 or version == last_version:
            return None
        # reshape the *source*: out.reshape(-1) of a strided out would copy into a temporary
        np.copyto(out, self._bufs[version & 1].reshape(out.shape))
        # Loads are not reordered with older loads (TSO): this read happens after the copy.
        moved = int(self._seq[0]) - s1
        if self._recheck and not 0 <= moved <= 2:   # < 0: a repair reset seq under us
            self.discarded += 1
            return None
        return version


# --------------------------------------------------------------------------- control block

class ProcState(enum.IntEnum):
    """pid state of the learner / a collector (written by that process)."""
    EMPTY = 0
    STARTING = 1
    RUNNING = 2
    STOPPING = 3
    FINISHED = 4
    FAILED = 5
    EXITED = 6


class SupervisorState(enum.IntEnum):
    """The launcher's view of a collector slot (written by the launcher)."""
    NOT_STARTED = 0
    LAUNCHED = 1
    RUNNING = 2
    RESTARTING = 3
    MANUAL = 4      # left for a person to start (manual_collectors)
    GAVE_UP = 5     # max_restarts exhausted
    EXITED = 6


class StopReason(enum.IntEnum):
    NONE = 0
    FINISHED = 1            # learner reached num_iterations
    INTERRUPTED = 2         # SIGINT / SIGTERM to the launcher
    LEARNER_FAILED = 3
    COLLECTOR_FAILED = 4
    HEARTBEAT_TIMEOUT = 5
    ERROR = 6


def _record(fields: list[tuple[str, str]], itemsize: int) -> np.dtype:
    """Packed record of 8-byte (or text) fields padded to itemsize (a multiple of 64)."""
    names, formats, offsets, off = [], [], [], 0
    for name, fmt in fields:
        dt = np.dtype(fmt)
        names.append(name), formats.append(dt), offsets.append(off)
        off += dt.itemsize
    assert off <= itemsize and itemsize % CACHE_LINE == 0, (fields, off, itemsize)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


# writer: launcher
LAUNCHER_DTYPE = _record([
    ("stop", "<i8"),               # 1 = everyone stop now (collectors, learner poll it)
    ("stop_reason", "<i8"),        # StopReason
    ("launcher_pid", "<i8"),
    ("started_ns", "<i8"),         # time.monotonic_ns() at creation
], 64)

# writer: learner
LEARNER_DTYPE = _record([
    ("pid", "<i8"),
    ("state", "<i8"),              # ProcState
    ("heartbeat_ns", "<i8"),       # time.monotonic_ns(); CLOCK_MONOTONIC is system-wide
    ("env_steps", "<i8"),          # env-steps ingested into the replay buffer (all collectors)
    ("num_updates", "<i8"),
    ("weight_version", "<i8"),     # last version published to the snapshots
    ("updates_per_s", "<f8"),
    ("learn_pct", "<f8"),          # % of learner wall time spent in updates
    ("env_steps_per_s", "<f8"),    # env steps produced per second by all collectors (last log window)
    ("started_ns", "<i8"),
    ("ingest_env_steps_per_s", "<f8"),  # env steps ingested per second (last log window)
    ("waiting_mask", "<u8"),       # bit i: planned collector i has not attached yet (learner holds)
    ("start_env_steps", "<i8"),    # env steps at start (a resumed run: the checkpoint's); set before RUNNING
], 128)

# Collector stats: cumulative; published under the record's stats_seq (see write_collector_stats).
# The collector loop's stages, in loop order; each has a cumulative "<stage>_ns" stats field.
STAGES = ("sample_actions", "env_step", "push", "sync", "wait")
STATS_FIELDS: tuple[tuple[str, str], ...] = (
    ("episodes", "<i8"),           # episodes finished
    ("return_sum", "<f8"),         # sum of their returns
    ("length_sum", "<i8"),         # sum of their lengths
    *((f"{stage}_ns", "<i8") for stage in STAGES),   # stage timing sums (ns)
    ("steps", "<i8"),              # env-step batches the timings cover
)
STATS_DTYPE = np.dtype(list(STATS_FIELDS))

# writer: collector i (one record per collector; 192 bytes = 3 lines, never shared)
COLLECTOR_DTYPE = _record([
    ("pid", "<i8"),
    ("incarnation", "<i8"),        # collector restart counter (also stamped into its slots)
    ("state", "<i8"),              # ProcState
    ("heartbeat_ns", "<i8"),       # time.monotonic_ns()
    ("env_steps", "<i8"),          # env-steps pushed (env-step batches x its num_envs)
    ("loaded_weight_version", "<i8"),
    ("started_ns", "<i8"),
    ("snapshot_stuck_ns", "<i8"),  # monotonic ns since its snapshot has been unreadable while newer
                                   # weights exist (0 = fine); see Collector._poll_weights
    ("stats_seq", "<i8"),          # tiny seqlock over the stats below (offset 64: own line)
    *STATS_FIELDS,
], 192)
_STATS_OFFSET = COLLECTOR_DTYPE.fields["episodes"][1]

# writer: learner (the learner's view of collector i)
INGEST_DTYPE = _record([
    ("ring_fill", "<i8"),          # slots used in ring i at the last status refresh
    ("policy_lag", "<i8"),         # max over the window of (snapshot version - version of an ingested slot)
    ("ingested_slots", "<i8"),
    ("ingested_env_steps", "<i8"),
    ("last_ingest_ns", "<i8"),     # time.monotonic_ns() of the last ingested slot
    ("attached", "<i8"),           # 1 once the learner attached this collector's ring and snapshot
    ("dropped", "<i8"),            # 1 while the learner refuses this collector's data (see faults)
    ("dropped_incarnation", "<i8"),  # collector incarnation the learner dropped; a newer one is re-attached
    ("faults", "<i8"),             # times the learner dropped this collector
    ("rejected_slots", "<i8"),     # slots never ingested: failed validation (non-finite, bad stamps)
    ("snapshot_repairs", "<i8"),   # publishes that found the snapshot's seq not as this writer left it
    ("fault", "S40"),              # short reason of the last drop
], 128)

# writer: launcher, once, before the control block's magic (read-only afterwards)
JOB_DTYPE = _record([
    ("settings_digest", "<u8"),    # crc32 of `settings`
    ("settings", "S2040"),         # JSON of the settings every process of the job must agree on
], 2048)

# writer: launcher (its supervision of collector i)
SUPERVISOR_DTYPE = _record([
    ("planned_node", "<i8"),       # NUMA node planned for the collector (-1 = unbound)
    ("restarts", "<i8"),
    ("state", "<i8"),              # SupervisorState
    ("launched_pid", "<i8"),
    ("launched_ns", "<i8"),
    ("cpus", "S64"),               # cpu list as short text, e.g. '0-7,16-23'
], 128)

CTL_LAUNCHER = HEADER_NBYTES
CTL_LEARNER = CTL_LAUNCHER + LAUNCHER_DTYPE.itemsize
CTL_COLLECTORS = CTL_LEARNER + LEARNER_DTYPE.itemsize
CTL_INGEST = CTL_COLLECTORS + MAX_COLLECTORS * COLLECTOR_DTYPE.itemsize
CTL_SUPERVISOR = CTL_INGEST + MAX_COLLECTORS * INGEST_DTYPE.itemsize
CTL_JOB = CTL_SUPERVISOR + MAX_COLLECTORS * SUPERVISOR_DTYPE.itemsize
CTL_NBYTES = _align(CTL_JOB + JOB_DTYPE.itemsize, PAGE)
CTL_LAUNCHER_LOCK = 0

_CTL_ROLES = ("launcher", "learner", "collector", "observer")


def _ctl_info(job: str, num_collectors: int) -> SegmentInfo:
    table = tuple((off, dt.descr) for off, dt in (
        (CTL_LAUNCHER, LAUNCHER_DTYPE), (CTL_LEARNER, LEARNER_DTYPE), (CTL_COLLECTORS, COLLECTOR_DTYPE),
        (CTL_INGEST, INGEST_DTYPE), (CTL_SUPERVISOR, SUPERVISOR_DTYPE), (CTL_JOB, JOB_DTYPE)))
    return SegmentInfo(SegmentKind.CTL, validate_job_name(job), -1,
                       {"num_collectors": num_collectors, "max_collectors": MAX_COLLECTORS}, "float32",
                       CTL_NBYTES, _digest(table))


class Record:
    """Typed access to one record: rec['heartbeat_ns'] -> int/float/str; writes checked by role.

    Field views are built once; a get/set is a dict lookup plus a scalar numpy access.
    """
    __slots__ = ("_views", "_writable", "_what")

    def __init__(self, arr0: np.ndarray, writable: bool, what: str, hidden: Iterable[str] = ()):
        skip = set(hidden)
        self._views = {n: arr0[n] for n in arr0.dtype.names if not n.startswith("_") and n not in skip}
        self._writable, self._what = writable, what

    def __getitem__(self, name: str):
        v = self._views[name][()]
        return v.decode(errors="replace") if isinstance(v, bytes) else v.item()

    def __setitem__(self, name: str, value) -> None:
        if not self._writable:
            raise ShmLayoutError(f"{self._what} is not written by this process (its single writer owns it)")
        if name not in self._views:
            raise KeyError(f"{self._what} has no field {name!r}; fields: {', '.join(self._views)}")
        self._views[name][()] = value.encode() if isinstance(value, str) else value

    def update(self, **values) -> None:
        for k, v in values.items():
            self[k] = v

    def keys(self) -> list[str]:
        return list(self._views)

    def as_dict(self) -> dict:
        return {k: self[k] for k in self._views}


class ControlBlock(_SegmentHandle):
    """Per-job control block. Created by the launcher, which holds its liveness lock.

    Roles decide what a handle may write (exactly one writer per field):
      launcher: ctl.launcher, ctl.supervisor(i)
      learner:  ctl.learner, ctl.ingest(i)
      collector (collector_id=i): ctl.collector(i), write_collector_stats(i, ...)
      observer: nothing (monitoring tools, tests)
    """

    def __init__(self, seg: _Segment, role: str, collector_id: int | None):
        self._seg, self.role, self.collector_id = seg, role, collector_id
        self._launch_guard: int | None = None   # the creating launcher's lock fd, see _hold_launch_guard
        self.job = seg.header_value("job")
        self.incarnation = int(seg.header["incarnation"])
        self.num_collectors = int(seg.header["params"][0])
        u8 = seg.u8

        def arr(off, dt, n=None):
            a = u8[off:off + dt.itemsize * (n or 1)].view(dt)
            return a if n else a.reshape(())

        def row(a, i):  # a 0-d array view (a[i] would be an np.void whose fields read as copies)
            return a[i:i + 1].reshape(())

        self._launcher = arr(CTL_LAUNCHER, LAUNCHER_DTYPE)
        self._learner = arr(CTL_LEARNER, LEARNER_DTYPE)
        self._collectors = arr(CTL_COLLECTORS, COLLECTOR_DTYPE, MAX_COLLECTORS)
        self._ingest = arr(CTL_INGEST, INGEST_DTYPE, MAX_COLLECTORS)
        self._supervisor = arr(CTL_SUPERVISOR, SUPERVISOR_DTYPE, MAX_COLLECTORS)
        self.launcher = Record(self._launcher, role == "launcher", "ctl.launcher (writer: launcher)")
        self.learner = Record(self._learner, role == "learner", "ctl.learner (writer: learner)")
        stat_names = [n for n, _ in STATS_FIELDS] + ["stats_seq"]
        self._col_rec = [Record(row(self._collectors, i), role == "collector" and collector_id == i,
                                f"ctl.collector({i}) (writer: collector {i})", hidden=stat_names)
                         for i in range(self.num_collectors)]
        self._ing_rec = [Record(row(self._ingest, i), role == "learner", f"ctl.ingest({i}) (writer: learner)")
                         for i in range(self.num_collectors)]
        self._sup_rec = [Record(row(self._supervisor, i), role == "launcher", f"ctl.supervisor({i}) (writer: launcher)")
                         for i in range(self.num_collectors)]
        # stats seqlock: int64 seq + a raw byte view of the stats for single-call copies
        self._stats_seq = [u8[CTL_COLLECTORS + i * COLLECTOR_DTYPE.itemsize + _STATS_OFFSET - 8:][:8].view(np.int64)
                           for i in range(self.num_collectors)]
        self._stats = [u8[CTL_COLLECTORS + i * COLLECTOR_DTYPE.itemsize + _STATS_OFFSET:][:STATS_DTYPE.itemsize]
                       .view(STATS_DTYPE).reshape(()) for i in range(self.num_collectors)]

    # ---- lifecycle

    @classmethod
    def create(cls, job: str, num_collectors: int, settings: dict | None = None) -> "ControlBlock":
        """Launcher only: new job incarnation; holds the liveness lock until close/exit.

        `settings` (JSON-able) are what every process attaching to the job must agree on
        (see fastsac.job_settings); they are written before the segment's magic, so no
        process can attach before they are in place. Refused while another launcher of this
        job is alive; stale segments of the job (a dead earlier launch) are removed first and
        listed in .removed_stale.
        """
        text = json.dumps(settings or {}, sort_keys=True).encode()
        if len(text) > JOB_DTYPE["settings"].itemsize:
            raise ShmLayoutError(f"job settings are {len(text)} bytes as JSON; the control block holds at most "
                                 f"{JOB_DTYPE['settings'].itemsize}")

        def write_settings(seg: _Segment) -> None:
            rec = seg.u8[CTL_JOB:CTL_JOB + JOB_DTYPE.itemsize].view(JOB_DTYPE).reshape(())
            rec["settings"] = text
            rec["settings_digest"] = np.uint64(zlib.crc32(text))

        check_memory_order()
        if isinstance(num_collectors, bool) or not isinstance(num_collectors, (int, np.integer)) \
                or not 1 <= num_collectors <= MAX_COLLECTORS:
            raise ShmLayoutError(f"num_collectors {num_collectors!r} is not valid; expected 1..{MAX_COLLECTORS}")
        info = _ctl_info(job, int(num_collectors))
        guard = _hold_launch_guard(job)
        try:
            if job_is_alive(job):
                raise ShmLayoutError(f"job {job!r} is already running (launcher pid {_ctl_launcher_pid(job)} holds "
                                     f"{info.name}); pick another job_name or stop it first")
            removed = unlink_job_segments(job, force=True)
            seg = _Segment.create(info, secrets.randbits(64), lock_byte=CTL_LAUNCHER_LOCK, init=write_settings)
        except BaseException:
            os.close(guard)
            raise
        ctl = cls(seg, "launcher", None)
        ctl._launch_guard = guard
        ctl.removed_stale = removed
        ctl.launcher.update(launcher_pid=os.getpid(), started_ns=time.monotonic_ns())
        return ctl

    @classmethod
    def attach(cls, job: str, role: str = "observer", collector_id: int | None = None,
               num_collectors: int | None = None) -> "ControlBlock":
        """Attach to a running job; num_collectors (from the config), when given, must match."""
        check_memory_order()
        validate_job_name(job)
        if role not in _CTL_ROLES or role == "launcher":
            raise ShmLayoutError(f"control block role {role!r} is not valid for attach; expected one of "
                                 "'learner', 'collector', 'observer' (the launcher creates it)")
        name = ctl_name(job)
        seg = _Segment.open_existing(name, f"no job {job!r} is running: segment {name} does not exist")
        try:
            n = int(seg.header["params"][0]) if int(seg.header["magic"]) == MAGIC else 0
            seg.validate(_ctl_info(job, n if num_collectors is None else num_collectors))
            if not seg.locked_by_other(CTL_LAUNCHER_LOCK):
                raise ShmLayoutError(f"job {job!r} is not running: its launcher (pid "
                                     f"{int(seg.u8[CTL_LAUNCHER + 16:][:8].view(np.int64)[0])}) is gone and "
                                     f"{name} is stale; {_remove_hint(job)}")
            if role == "collector":
                if collector_id is None or not 0 <= _check_collector_id(collector_id) < n:
                    raise ShmLayoutError(f"collector_id {collector_id!r} is not valid for job {job!r}: "
                                         f"it has {n} collectors (0..{n - 1})")
            return cls(seg, role, collector_id)
        except BaseException:
            seg.close()
            raise

    def close(self) -> None:
        if self._launch_guard is not None:
            os.close(self._launch_guard)
            self._launch_guard = None
        self._col_rec = self._ing_rec = self._sup_rec = self._stats = self._stats_seq = []
        self.launcher = self.learner = None
        self._launcher = self._learner = self._collectors = self._ingest = self._supervisor = None
        self._seg.close()

    def unlink(self, include_collectors: bool = True) -> list[str]:
        """Launcher at shutdown: remove this job's rings/snapshots (this incarnation) and the ctl."""
        if self.role != "launcher":
            raise ShmLayoutError("only the launcher unlinks the control block")
        removed = []
        if include_collectors:
            for seg in _scan(self.job):
                if seg.kind != SegmentKind.CTL and _incarnation_of(seg.name) in (self.incarnation, None):
                    if _unlink_quiet(seg.name):
                        removed.append(seg.name)
        if self._seg.unlink():
            removed.append(self._seg.name)
        return removed

    def still_current(self) -> bool:
        """False once the launcher is gone or the name was re-created by a new launch."""
        return self._seg.still_named() and (self.role == "launcher" or self._seg.locked_by_other(CTL_LAUNCHER_LOCK))

    # ---- records

    def _cid(self, i: int) -> int:
        if not 0 <= i < self.num_collectors:
            raise ShmLayoutError(f"collector {i} does not exist in job {self.job!r} (0..{self.num_collectors - 1})")
        return i

    def collector(self, i: int) -> Record:
        """Fields written by collector i (stats excluded: use read/write_collector_stats)."""
        return self._col_rec[self._cid(i)]

    def ingest(self, i: int) -> Record:
        """Fields the learner writes about collector i."""
        return self._ing_rec[self._cid(i)]

    def supervisor(self, i: int) -> Record:
        """Fields the launcher writes about collector i."""
        return self._sup_rec[self._cid(i)]

    # ---- job settings (writer: launcher, before magic)

    def job_settings(self) -> dict:
        """The settings the launcher recorded for this job (see ControlBlock.create)."""
        rec = self._seg.u8[CTL_JOB:CTL_JOB + JOB_DTYPE.itemsize].view(JOB_DTYPE).reshape(())
        text = bytes(rec["settings"][()])
        if zlib.crc32(text) != int(rec["settings_digest"]):
            raise ShmLayoutError(f"the job settings in {self.name} are corrupt (digest mismatch)")
        return json.loads(text.decode()) if text else {}

    # ---- stop (writer: launcher)

    def request_stop(self, reason: StopReason) -> None:
        if self.role != "launcher":
            raise ShmLayoutError("only the launcher writes the stop flag; other processes report their state "
                                 "(FINISHED / FAILED) and the launcher decides")
        self.launcher["stop_reason"] = int(reason)
        self.launcher["stop"] = 1

    def stop_requested(self) -> bool:
        return bool(self.launcher["stop"])

    @property
    def stop_reason(self) -> StopReason:
        return StopReason(self.launcher["stop_reason"])

    # ---- collector stats (tiny seqlock; writer: collector i)

    def write_collector_stats(self, i: int, stats: dict) -> None:
        """Collector i publishes its cumulative stats; never blocks (seq odd, write, seq even)."""
        self._cid(i)
        if self.role != "collector" or self.collector_id != i:
            raise ShmLayoutError(f"collector stats of {i} are written by collector {i} only")
        seq, rec = self._stats_seq[i], self._stats[i]
        s = int(seq[0])
        seq[0] = s + 1
        for k, v in stats.items():
            rec[k] = v
        seq[0] = s + 2

    def read_collector_stats(self, i: int) -> dict | None:
        """A consistent copy of collector i's stats, or None if it was being written (retry later)."""
        self._cid(i)
        seq = self._stats_seq[i]
        s1 = int(seq[0])
        if s1 & 1:
            return None
        copy = self._stats[i].copy()
        if int(seq[0]) != s1:
            return None
        return {k: copy[k].item() for k in STATS_DTYPE.names}

    # ---- aggregation

    def total_collector_env_steps(self) -> int:
        return int(self._collectors["env_steps"][:self.num_collectors].sum())

    def collector_states(self) -> list[ProcState]:
        return [ProcState(int(s)) for s in self._collectors["state"][:self.num_collectors]]

    def heartbeat_ages_s(self, now_ns: int | None = None) -> list[float | None]:
        """Seconds since each collector's last heartbeat (None: never beat)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        return [None if hb == 0 else (now - int(hb)) / 1e9 for hb in self._collectors["heartbeat_ns"][:self.num_collectors]]

    def learner_heartbeat_age_s(self, now_ns: int | None = None) -> float | None:
        hb = self.learner["heartbeat_ns"]
        return None if hb == 0 else ((time.monotonic_ns() if now_ns is None else now_ns) - hb) / 1e9


# --------------------------------------------------------------------------- liveness & staleness

def _open_quiet(name: str) -> _Segment | None:
    try:
        return _Segment.open_existing(name, "")
    except (ShmLayoutError, OSError):
        return None


def _ctl_launcher_pid(job: str) -> int:
    seg = _open_quiet(ctl_name(job))
    if seg is None:
        return -1
    try:
        return int(seg.u8[CTL_LAUNCHER + 16:][:8].view(np.int64)[0])
    finally:
        seg.close()


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


def _incarnation_of(name: str) -> int | None:
    seg = _open_quiet(name)
    if seg is None:
        return None
    try:
        return int(seg.header["incarnation"]) if int(seg.header["magic"]) == MAGIC else None
    finally:
        seg.close()


@dataclass(frozen=True)
class StaleSegment:
    name: str                 # '/fastsac.J.c0.ring'
    job: str
    kind: SegmentKind
    collector_id: int
    nbytes: int
    reason: str
    attached_pids: tuple[int, ...] = ()   # processes still attached (orphans), if known

    @property
    def remove_command(self) -> str:
        return f"python -m fastsac.shm_layout clean --job {self.job}"


@dataclass(frozen=True)
class _Found:
    name: str
    job: str
    kind: SegmentKind
    collector_id: int


def _scan(job: str | None = None) -> list[_Found]:
    try:
        entries = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return []
    out = []
    for fname in entries:
        parsed = parse_segment_name(fname)
        if parsed and (job is None or parsed[0] == job):
            out.append(_Found("/" + fname, *parsed))
    return out


def _ctl_status(job: str) -> tuple[bool, str, int | None]:
    """(alive, why-dead, incarnation) of a job's control block."""
    name = ctl_name(job)
    if not os.path.exists(_path(name)):
        return False, f"its job's control block {name} is gone", None
    alive = job_is_alive(job)
    seg = _open_quiet(name)
    if seg is None:
        if alive:  # being created: too small to read yet
            return True, "", None
        return False, f"job {job!r} is dead ({name} is unreadable and no launcher holds it)", None
    try:
        if alive:
            inc = int(seg.header["incarnation"]) if int(seg.header["magic"]) == MAGIC else None
            return True, "", inc
        pid = int(seg.u8[CTL_LAUNCHER + 16:][:8].view(np.int64)[0]) or int(seg.header["creator_pid"])
        why = [f"launcher pid {pid} no longer holds it"]
        if int(seg.header["magic"]) != MAGIC:
            why.append("creation never finished")
        elif seg.header_value("boot_id") != boot_id():
            why.append("created before the last reboot")
        elif not pid_alive(pid):
            why.append("that process is gone")
        return False, f"job {job!r} is dead ({'; '.join(why)})", int(seg.header["incarnation"])
    finally:
        seg.close()


def _segment_stale_reason(found: _Found, ctl: tuple[bool, str, int | None]) -> tuple[str | None, tuple[int, ...]]:
    alive, why, ctl_inc = ctl
    if found.kind == SegmentKind.CTL:
        return (None if alive else why), ()
    seg = _open_quiet(found.name)
    if seg is None:
        return ("unreadable or too small (creation crashed)" if not alive else None), ()
    try:
        pids = ()
        creating = int(seg.header["magic"]) != MAGIC
        locks = (((RING_PRODUCER_LOCK, RING_PRODUCER_PID), (RING_CONSUMER_LOCK, RING_CONSUMER_PID))
                 if found.kind == SegmentKind.RING else
                 ((WTS_WRITER_LOCK, WTS_WRITER_PID), (WTS_READER_LOCK, WTS_READER_PID)))
        pids = tuple(int(seg.u8[line:line + 8].view(np.int64)[0]) for byte, line in locks
                     if seg.locked_by_other(byte))
        if not alive:
            return why, pids
        if creating:
            # Live job, header not written yet: being created (the creator holds its lock) or crashed.
            return (None if pids else "creation never finished and nobody holds it"), pids
        inc = int(seg.header["incarnation"])
        if ctl_inc is not None and inc != ctl_inc:
            return (f"left over from an earlier launch of job {found.job!r} "
                    f"(incarnation {inc:#x}, running {ctl_inc:#x})"), pids
        if seg.header_value("boot_id") != boot_id():
            return "created before the last reboot", pids
        return None, pids
    finally:
        seg.close()


def find_stale_segments(job: str | None = None) -> list[StaleSegment]:
    """Segments of dead jobs (or of earlier launches of a live job), with the reason.

    Never reports a segment of a live job's current incarnation.
    """
    if job is not None:
        validate_job_name(job)
    found = _scan(job)
    ctl_cache: dict[str, tuple[bool, str, int | None]] = {}
    out = []
    for f in found:
        if f.job not in ctl_cache:
            ctl_cache[f.job] = _ctl_status(f.job)
        reason, pids = _segment_stale_reason(f, ctl_cache[f.job])
        if reason is not None:
            try:
                nbytes = os.stat(_path(f.name)).st_size
            except FileNotFoundError:
                continue
            out.append(StaleSegment(f.name, f.job, f.kind, f.collector_id, nbytes, reason, pids))
    return out


def format_stale_report(stale: list[StaleSegment]) -> str:
    if not stale:
        return "no stale fastsac segments"
    lines = [f"{len(stale)} stale fastsac segment(s) in {SHM_DIR} ({_mb(sum(s.nbytes for s in stale))}):"]
    for s in stale:
        extra = f"; still mapped by pid {', '.join(map(str, s.attached_pids))}" if s.attached_pids else ""
        lines.append(f"  {s.name} ({_mb(s.nbytes)}): {s.reason}{extra}")
    for job in sorted({s.job for s in stale}):
        lines.append(f"remove with: python -m fastsac.shm_layout clean --job {job}")
    return "\n".join(lines)


class LaunchLockError(ShmLayoutError):
    """The job cannot start: another launcher of it holds the launch lock (or the lock is unusable)."""


def launch_lock_dir() -> str:
    """A directory only this user can write: $XDG_RUNTIME_DIR/fastsac, else /tmp/fastsac-<uid>.

    The launch lock must be private to the user: a lock in a shared namespace (an abstract
    socket name, a file in /tmp or /dev/shm) can be taken by any local user, who would then
    keep the job from ever starting.
    """
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == uid:
        path = os.path.join(runtime, "fastsac")
    else:
        path = f"/tmp/fastsac-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LaunchLockError(f"cannot create the launch-lock directory {path}: {exc}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise LaunchLockError(f"the launch-lock directory {path} is not a private directory of uid {uid} "
                              f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}); another user may have "
                              "made it: remove it, or set XDG_RUNTIME_DIR to a directory of yours")
    return path


def _hold_launch_guard(job: str) -> int:
    """Take the exclusive flock on <launch_lock_dir>/<job>.launch: one launcher of a job at a time.

    The control segment's lock says whether a launcher is alive, but a launch first removes
    stale segments and then creates the control segment, and two launches started within
    microseconds could both pass the liveness check and one remove the other's new segment.
    flock is atomic and the kernel drops it when its holder exits, however it dies; the file
    lives in a directory private to the user, so nobody else can take it. Returns the fd
    (close-on-exec: children do not inherit it).
    """
    path = os.path.join(launch_lock_dir(), f"{validate_job_name(job)}.launch")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise LaunchLockError(f"job {job!r}: cannot take the launch lock {path}: {exc}") from None
        pid = _ctl_launcher_pid(job) if job_is_alive(job) else -1
        holder = f"launcher pid {pid}" if pid > 0 else "another launcher of it is starting"
        raise LaunchLockError(f"job {job!r} is already running ({holder}; it holds {path}); pick another "
                              "job_name or stop it first") from None
    return fd


def _replace_if_stale(info: SegmentInfo) -> None:
    """create(): refuse an existing name unless it is stale, then remove it."""
    path = _path(info.name)
    if not os.path.exists(path):
        return
    found = _Found(info.name, info.job, info.kind, info.collector_id)
    reason, pids = _segment_stale_reason(found, _ctl_status(info.job))
    if info.kind == SegmentKind.RING and pids:
        seg = _open_quiet(info.name)
        holder = -1
        if seg is not None:
            try:
                if seg.locked_by_other(RING_PRODUCER_LOCK):
                    holder = int(seg.u8[RING_PRODUCER_PID:][:8].view(np.int64)[0])
            finally:
                seg.close()
        if holder != -1:
            raise ShmLayoutError(f"{info.what}: {info.name} is attached by producer pid {holder}: collector_id "
                                 f"{info.collector_id} is taken")
    if reason is None:
        raise ShmLayoutError(f"{info.what}: segment {info.name} already exists and belongs to the running job "
                             f"{info.job!r}; attach to it (a restarted collector attaches as producer)")
    _unlink_quiet(info.name)


def unlink_job_segments(job: str, force: bool = False) -> list[str]:
    """Remove every segment of a dead job; returns the names removed.

    Refused while the job's launcher is alive (never overridable). Without force, also
    refused while an orphaned collector/learner is still attached to one of its rings;
    force unlinks anyway (the orphan keeps its private mapping until it exits).
    """
    validate_job_name(job)
    if job_is_alive(job):
        raise ShmLayoutError(f"job {job!r} is alive (launcher pid {_ctl_launcher_pid(job)} holds "
                             f"{ctl_name(job)}); stop it first: nothing unlinks a live job's segments")
    found = _scan(job)
    if not force:
        ctl = _ctl_status(job)
        attached = {f.name: pids for f in found for _, pids in [_segment_stale_reason(f, ctl)] if pids}
        if attached:
            desc = "; ".join(f"{n} by pid {', '.join(map(str, p))}" for n, p in attached.items())
            raise ShmLayoutError(f"job {job!r} is dead but processes are still attached ({desc}); "
                                 "stop them, or pass force=True (--force)")
    removed = []
    # ctl last: while it exists, a concurrent create() of this job cannot mistake us for live.
    for f in sorted(found, key=lambda f: f.kind == SegmentKind.CTL):
        if _unlink_quiet(f.name):
            removed.append(f.name)
    return removed


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    """python -m fastsac.shm_layout list [--job J] | clean --job J [--force] | clean --all-stale"""
    import argparse
    p = argparse.ArgumentParser(prog="python -m fastsac.shm_layout", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="list fastsac segments and whether they are stale")
    ls.add_argument("--job")
    cl = sub.add_parser("clean", help="remove the segments of a dead job")
    cl.add_argument("--job")
    cl.add_argument("--all-stale", action="store_true", help="remove every stale segment of any job")
    cl.add_argument("--force", action="store_true", help="also if orphaned processes are still attached")
    args = p.parse_args(argv)
    try:
        if args.cmd == "list":
            stale = {s.name: s for s in find_stale_segments(args.job)}
            for f in _scan(args.job):
                s = stale.get(f.name)
                print(f"{f.name:48s} {'STALE: ' + s.reason if s else 'live'}")
            if stale:
                print(format_stale_report(list(stale.values())))
            return 0
        if args.all_stale:
            for s in find_stale_segments(args.job):
                if _unlink_quiet(s.name):
                    print(f"removed {s.name} ({s.reason})")
            return 0
        if not args.job:
            p.error("clean needs --job J or --all-stale")
        for name in unlink_job_segments(args.job, force=args.force):
            print(f"removed {name}")
        return 0
    except ShmLayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
