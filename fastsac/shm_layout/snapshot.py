"""The weight snapshot of collector i: a seqlock-protected double buffer of the flat actor
weights, written by the learner and read by collector i (argued in docs/shared-memory.md, "Weight
snapshot")."""
from __future__ import annotations

import os
import time

import numpy as np

from fastsac.shm_layout.cleanup import _replace_if_stale
from fastsac.shm_layout.common import (
    CACHE_LINE,
    DATA_OFFSET,
    EVALUATOR_ID,
    HEADER_NBYTES,
    PAGE,
    SegmentKind,
    ShmLayoutError,
    _align,
    _check_collector_id,
    _digest,
    check_memory_order,
    validate_job_name,
)
from fastsac.shm_layout.locks import (
    WTS_READER_LOCK,
    WTS_READER_PID,
    WTS_WRITER_LOCK,
    WTS_WRITER_PID,
    read_pid,
)
from fastsac.shm_layout.segment import SegmentInfo, _incarnation_of, _Segment, _SegmentHandle

WTS_SEQ = HEADER_NBYTES + 0 * CACHE_LINE         # writer: learner. even = stable, version = seq // 2
# Lines 1 and 2 hold the writer's and the reader's pids (locks.py).


def _buffer_stride(numel: int) -> int:
    """Bytes of one of the two weight buffers: numel float32, page-aligned."""
    if isinstance(numel, bool) or not isinstance(numel, (int, np.integer)) or numel < 1:
        raise ShmLayoutError(f"weight snapshot numel {numel!r} is not valid; expected an integer >= 1")
    return _align(int(numel) * 4, PAGE)


def snapshot_nbytes(numel: int) -> int:
    """Size of a weight snapshot segment of numel float32 weights (the launcher's /dev/shm check)."""
    return DATA_OFFSET + 2 * _buffer_stride(numel)


def _wts_info(job: str, collector_id: int, numel: int) -> SegmentInfo:
    stride = _buffer_stride(numel)
    table = (WTS_SEQ, WTS_WRITER_PID, WTS_READER_PID, DATA_OFFSET, "buffers=2")
    owner = EVALUATOR_ID if collector_id == EVALUATOR_ID else _check_collector_id(collector_id)
    return SegmentInfo(SegmentKind.WTS, validate_job_name(job), owner,
                       {"numel": int(numel), "buffer_stride": stride}, "float32", snapshot_nbytes(numel),
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
        seg = _Segment.open_validated(info, incarnation, f"{info.what}: segment {info.name} does not exist "
                                      f"(collector {info.collector_id} of job {job!r} has not created it)")
        try:
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
            holder = read_pid(seg.u8, line)
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
