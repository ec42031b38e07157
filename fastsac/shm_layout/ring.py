"""The transition ring of collector i: slot layout (RingSpec, SlotView) and the SPSC ring itself.

Writers: slot contents + write cursor + producer pid: the producer (collector i); read
cursor + consumer pid: the consumer (the learner). Data is written before the cursor that
publishes it and read after the cursor that announced it (x86-64 TSO, see
common.check_memory_order).
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import numpy as np

from fastsac.shm_layout.cleanup import _replace_if_stale
from fastsac.shm_layout.common import (
    CACHE_LINE, DATA_OFFSET, HEADER_NBYTES, SegmentKind, SegmentTaken, ShmLayoutError, _align, _check_collector_id,
    _digest, check_memory_order, validate_job_name,
)
from fastsac.shm_layout.locks import (
    RING_CONSUMER_LOCK, RING_CONSUMER_PID, RING_PRODUCER_LOCK, RING_PRODUCER_PID, read_pid,
)
from fastsac.shm_layout.segment import (
    SegmentInfo, _incarnation_of, _open_quiet, _Segment, _SegmentHandle, _unlink_quiet,
)
from fastsac.common.transition import FIELDS, TransitionBatch, fields_for

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
# Lines 2 and 3 hold the producer's and the consumer's [pid, attached_ns] (locks.py).


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
        """The slot header, then the transition fields (fastsac.common.transition.FIELDS) in their order:
        the dense ones (every env) first, the final-row ones last."""
        dense = [("header", np.dtype(np.int64), (SLOT_HEADER_NBYTES // 8,))]
        sparse = []
        for f in fields_for(self.critic_obs_dim):
            shape = (self.num_envs, *f.row_shape(self.obs_dim, self.critic_obs_dim, self.act_dim))
            (sparse if f.final else dense).append((f.name, f.dtype, shape))
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

    def segment_info(self, job: str, collector_id: int) -> SegmentInfo:
        table = (tuple((f.name, f.offset, f.dtype.str, f.shape) for f in self.slot_fields()),
                 RING_WRITE_CURSOR, RING_READ_CURSOR, RING_PRODUCER_PID, RING_CONSUMER_PID, DATA_OFFSET)
        params = {"num_envs": self.num_envs, "obs_dim": self.obs_dim, "critic_obs_dim": self.critic_obs_dim,
                  "act_dim": self.act_dim, "capacity": self.capacity, "slot_nbytes": self.slot_nbytes,
                  "dense_nbytes": self.dense_nbytes}
        return SegmentInfo(SegmentKind.RING, validate_job_name(job), _check_collector_id(collector_id), params,
                           "float32", self.segment_nbytes, _digest(table))


class SlotView:
    """Zero-copy numpy views of one ring slot, one attribute per transition field (None for a
    field the task lacks), built once per slot at attach.

    Valid while the ring is attached. A consumer must copy what it needs before release().
    """
    __slots__ = ("index", "raw", "_h", "_dense", "_final", *(f.name for f in FIELDS))

    def __init__(self, index: int, raw: np.ndarray, spec: RingSpec):
        self.index = index
        self.raw = raw  # uint8[slot_nbytes]
        views = {f.name: raw[f.offset:f.offset + f.nbytes].view(f.dtype).reshape(f.shape)
                 for f in spec.slot_fields()}
        self._h = views.pop("header")
        for f in FIELDS:
            setattr(self, f.name, views.get(f.name))
        present = fields_for(spec.critic_obs_dim)
        self._dense = tuple(f.name for f in present if not f.final)
        self._final = tuple(f.name for f in present if f.final and f.name != "final_idx")

    def write(self, batch: TransitionBatch, weight_version: int, env_step: int, incarnation: int) -> None:
        """Copy one env-step batch into this slot, every field shape-checked (a wrong shape would
        broadcast silently). final_obs / final_critic_obs may be the compacted [num_final, dim]
        rows or the env's full [N, dim] arrays (rows final_idx are gathered). Only num_final
        rows are copied. Publish with TransitionRing.commit()."""
        for name in self._dense:
            _copy(getattr(self, name), getattr(batch, name), name)
        nf = batch.num_final
        if nf > len(self.final_idx):
            raise ShmLayoutError(f"final_idx has {nf} entries but the ring has {len(self.final_idx)} envs")
        if nf:
            self.final_idx[:nf] = batch.final_idx
            for name in self._final:
                _copy_rows(getattr(self, name), getattr(batch, name), batch.final_idx, nf, name)
        h = self._h
        h[HDR["num_final"]], h[HDR["weight_version"]] = nf, weight_version
        h[HDR["env_step"]], h[HDR["incarnation"]] = env_step, incarnation

    def _get(i):  # noqa: N805 - property factory
        return property(lambda self: int(self._h[i]), lambda self, v: self._h.__setitem__(i, v))

    weight_version = _get(0)   # actor version the actions were sampled with (producer)
    env_step = _get(1)         # collector-local env-step batch counter (producer)
    num_final = _get(2)        # rows valid in final_idx / final_obs / final_critic_obs
    incarnation = _get(3)      # collector incarnation (restart counter) that produced the slot
    produced_ns = _get(4)      # time.monotonic_ns() at commit
    seq = _get(5)              # write-cursor value of this slot (set by commit)
    del _get


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
                                             f"{read_pid(seg.u8, RING_PRODUCER_PID)}: "
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
        seg = _Segment.open_validated(info, incarnation, f"{info.what}: segment {info.name} does not exist "
                                      f"(collector {info.collector_id} of job {job!r} has not created it)")
        try:
            byte, pid_line = ((RING_PRODUCER_LOCK, RING_PRODUCER_PID) if role == "producer"
                              else (RING_CONSUMER_LOCK, RING_CONSUMER_PID))
            if not seg.try_lock(byte):
                holder = read_pid(seg.u8, pid_line)
                raise SegmentTaken(f"{info.what} already has a {role} (pid {holder}): collector_id "
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

    def try_push(self, batch: TransitionBatch, weight_version: int, env_step: int, incarnation: int) -> bool:
        """Copy one env-step batch into the ring (SlotView.write) and commit it; False (nothing
        written) when full. The collector does the same in two steps: next_free_slot() before it
        steps its envs (backpressure), slot.write(...) and commit() after."""
        slot = self.next_free_slot()
        if slot is None:
            return False
        try:
            slot.write(batch, weight_version, env_step, incarnation)
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

    def copy_out(self, dense: np.ndarray, finals: np.ndarray, max_slots: int) -> tuple[int, list[int], int]:
        """Copy the oldest unread slots out of shared memory, without their reserved space.

        dense: uint8 [>= k, dense_nbytes] receives the always-valid part of each slot (header ..
        truncated) in <= 2 strided copies (two when the slots wrap around the ring's end).
        finals: flat uint8 receives, for each slot whose num_final > 0, only those rows of each
        sparse field, packed as final_rows_layout(num_final) says (usually nothing: episodes end
        rarely). Returns k, per slot the offset of its packed rows in finals (-1: none), and the
        bytes of finals used.
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
        return k, offsets, pos

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
