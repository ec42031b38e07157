"""The transition ring of collector i: the SPSC ring itself (TransitionRing). Its byte format,
the slot layout and the typed views of a slot, are ring_layout's.

Writers: slot contents + write cursor + producer pid: the producer (collector i); read
cursor + consumer pid: the consumer (the learner). Data is written before the cursor that
publishes it and read after the cursor that announced it (x86-64 TSO, see
common.check_memory_order).
"""
from __future__ import annotations

import os
import time

import numpy as np

from fastsac.common.transition import TransitionBatch
from fastsac.shm_layout.cleanup import _replace_if_stale
from fastsac.shm_layout.common import DATA_OFFSET, SegmentTaken, ShmLayoutError, _align, check_memory_order
from fastsac.shm_layout.locks import (
    RING_CONSUMER_LOCK, RING_CONSUMER_PID, RING_PRODUCER_LOCK, RING_PRODUCER_PID, read_pid,
)
from fastsac.shm_layout.ring_layout import (
    HDR, RING_READ_CURSOR, RING_WRITE_CURSOR, RingSpec, SlotView, StagedSlots, StagingSpan, staged_headers,
)
from fastsac.shm_layout.segment import _incarnation_of, _open_quiet, _Segment, _SegmentHandle, _unlink_quiet


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

    def copy_into(self, buffer: np.ndarray, at: int, max_slots: int) -> StagedSlots:
        """copy_out() into one flat uint8 buffer from byte `at` on: the dense block first, then the
        packed final rows, each piece 64-byte aligned; as many of max_slots as fit (at most
        RingSpec.staging_nbytes per slot). Returns the typed view of the copied slots; its
        `span` says where they lie, and where the next copy may start."""
        sp = self.spec
        k = min(max_slots, (len(buffer) - at) // sp.staging_nbytes(1))
        dense = buffer[at:at + k * sp.dense_nbytes].reshape(k, sp.dense_nbytes)
        finals_at = _align(at + k * sp.dense_nbytes)
        k, offsets, finals_nbytes = self.copy_out(dense, buffer[finals_at:], k)
        end = _align(finals_at + finals_nbytes)
        return StagedSlots(sp, dense[:k], buffer[finals_at:end], offsets, StagingSpan(at, finals_at, end))

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

