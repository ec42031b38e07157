"""The common header of every segment, and one mapped segment: create (reserve, pre-fault,
header with magic last), open, validate against what the caller expects, lock, unlink, close."""
from __future__ import annotations

import errno
import mmap
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import posix_ipc

from fastsac.common.procs import boot_id
from fastsac.shm_layout.common import (
    HEADER_NBYTES, LAYOUT_VERSION, MAGIC, SHM_DIR, MADV_POPULATE_WRITE, SegmentKind, ShmLayoutError,
    _describe, _mb, _path, cleanup_command, segment_name, shm_free_bytes,
)
from fastsac.shm_layout.locks import _byte_locked_by_other, _lock_byte, _unlock_byte


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
    SegmentKind.CTL: ("num_collectors", "max_collectors", "num_learners"),
    SegmentKind.RING: ("num_envs", "obs_dim", "critic_obs_dim", "act_dim", "capacity",
                       "slot_nbytes", "dense_nbytes"),
    SegmentKind.WTS: ("numel", "buffer_stride"),
    SegmentKind.EVAL: ("record_nbytes",),
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

    @classmethod
    def open_validated(cls, info: "SegmentInfo", incarnation: int | None, missing_msg: str) -> "_Segment":
        """open_existing + validate against `info` (and the job's incarnation, when given); closed
        again if it is not the segment this job's layout expects."""
        seg = cls.open_existing(info.name, missing_msg)
        try:
            seg.validate(info, incarnation)
        except BaseException:
            seg.close()
            raise
        return seg

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
    return f"remove it with: {cleanup_command(job)}"


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


# --------------------------------------------------------------------------- handles and probes

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

def _open_quiet(name: str) -> _Segment | None:
    try:
        return _Segment.open_existing(name, "")
    except (ShmLayoutError, OSError):
        return None

def _incarnation_of(name: str) -> int | None:
    """The job incarnation a segment belongs to; None if it is missing or not initialized."""
    seg = _open_quiet(name)
    if seg is None:
        return None
    try:
        return int(seg.header["incarnation"]) if int(seg.header["magic"]) == MAGIC else None
    finally:
        seg.close()
