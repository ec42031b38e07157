"""The transition ring's byte format, the one place that knows it: where the cursors live, the
slot layout (RingSpec, and job_ring_spec: the RingSpec of a job's collector), typed views of one
slot in the ring (SlotView) and of slots copied out of it (StagedSlots: stamps, the finite
check, typed field views).

Nothing outside this module computes an offset into a slot: the collector writes through
SlotView, the ring copies raw slot bytes (ring.py), and the learner reads what it copied through
StagedSlots. Torch-free: StagedSlots reads a torch byte tensor as well as a numpy buffer.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from fastsac.common.transition import FIELDS, TransitionBatch, fields_for
from fastsac.config import Config
from fastsac.shm_layout.common import (
    CACHE_LINE, DATA_OFFSET, HEADER_NBYTES, SegmentKind, ShmLayoutError, _align, _check_collector_id, _digest,
    validate_job_name,
)
from fastsac.shm_layout.locks import RING_CONSUMER_PID, RING_PRODUCER_PID
from fastsac.shm_layout.segment import SegmentInfo

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

    @functools.cached_property
    def _dense_fields(self) -> dict[str, SlotField]:
        """The transition fields every slot holds for every env (obs .. truncated), by name."""
        return {f.name: f for f in self.slot_fields() if f.name != "header" and f.offset < self.dense_nbytes}

    def dense_field(self, name: str) -> SlotField:
        return self._dense_fields[name]

    def dense_field_names(self) -> tuple[str, ...]:
        return tuple(self._dense_fields)

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

    def staging_nbytes(self, max_slots: int) -> int:
        """The most bytes TransitionRing.copy_into() takes for max_slots slots: per slot its dense
        part and final rows (together at most slot_nbytes), plus the alignment of the two pieces."""
        return max_slots * (self.slot_nbytes + 2 * CACHE_LINE)

    @functools.cached_property
    def _dense_float_span(self) -> tuple[int, int]:
        """(start, end) in a slot of the dense float32 fields (obs .. rewards, one contiguous run with
        the padding between them), so the finite check reads them in one pass."""
        floats = [f for f in self.slot_fields() if f.offset < self.dense_nbytes and f.dtype == np.float32]
        return floats[0].offset, floats[-1].offset + floats[-1].nbytes

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


def job_ring_spec(cfg: Config, dims, num_envs: int) -> RingSpec:
    """The ring of a job's collector that steps num_envs envs of a task; dims is anything with
    obs_dim, critic_obs_dim and act_dim (the env, or the task's EnvSpec). The one place the
    collector (creates it), the learner (attaches it) and the launcher's checks (size it) build it."""
    return RingSpec(num_envs=num_envs, obs_dim=dims.obs_dim, critic_obs_dim=dims.critic_obs_dim,
                    act_dim=dims.act_dim, capacity=cfg.trainer.async_options.ring_capacity)


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


# --------------------------------------------------------------------------- slots copied out

class SlotStamps(NamedTuple):
    """The header of one slot (SLOT_HEADER_FIELDS), as its producer stamped it."""
    weight_version: int
    env_step: int
    num_final: int
    incarnation: int
    produced_ns: int
    seq: int


class StagingSpan(NamedTuple):
    """Where TransitionRing.copy_into() put k slots in its buffer: [dense_at, finals_at) the dense
    block, [finals_at, end) the packed final rows; the next slots may start at end."""
    dense_at: int
    finals_at: int
    end: int


def _numpy_dtype(dtype: np.dtype) -> np.dtype:
    return dtype


class StagedSlots:
    """k slots as TransitionRing.copy_out() left them, read through typed views: stamps, fields,
    final rows, the checks on flags and values. No caller computes an offset.

    dense: [k, dense_nbytes] bytes, each slot's header .. truncated; finals: flat bytes holding,
    for slot j with offsets[j] >= 0, its first num_final rows of each sparse field, packed as
    RingSpec.final_rows_layout() says. The bytes are a numpy uint8 array, or a torch uint8 tensor
    (twin(): the learner's device copy), whose element types dtype_of maps from numpy's. The
    headers are copied from the host bytes once, so they outlive a rewrite of the buffer.
    """

    def __init__(self, spec: RingSpec, dense: Any, finals: Any, offsets: list[int],
                 span: StagingSpan | None = None, headers: np.ndarray | None = None,
                 dtype_of: Callable[[np.dtype], Any] = _numpy_dtype):
        self.spec, self.dense, self.finals, self.offsets, self.span = spec, dense, finals, list(offsets), span
        self.k = len(self.offsets)
        self.headers = staged_headers(dense, self.k).copy() if headers is None else headers  # int64 [k, 8]
        self._dtype_of = dtype_of

    def twin(self, buffer: Any, dtype_of: Callable[[np.dtype], Any]) -> "StagedSlots":
        """The same slots in a twin of the buffer copy_into() copied them into, at the same places
        (the learner's device copy of its staging buffer)."""
        p, dn = self.span, self.spec.dense_nbytes
        return StagedSlots(self.spec, buffer[p.dense_at:p.dense_at + self.k * dn].reshape(self.k, dn),
                           buffer[p.finals_at:p.end], self.offsets, p, self.headers, dtype_of)

    def stamps(self, j: int) -> SlotStamps:
        return SlotStamps(*(int(v) for v in self.headers[j, :len(SLOT_HEADER_FIELDS)]))

    def _typed(self, raw: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        return raw.view(self._dtype_of(dtype)).reshape(shape)

    def field(self, name: str) -> Any:
        """A dense field of every slot: [k, *shape] (obs, critic_obs, actions, rewards, terminated, truncated)."""
        f = self.spec.dense_field(name)
        return self._typed(self.dense[:, f.offset:f.offset + f.nbytes], f.dtype, (self.k, *f.shape))

    def final_rows(self, j: int) -> dict[str, Any]:
        """Slot j's first num_final rows of each sparse field (final_idx, final_obs, ...): [num_final, *row]."""
        nf, pos = int(self.headers[j, HDR["num_final"]]), self.offsets[j]
        out = {}
        for f, off, nbytes in self.spec.final_rows_layout(nf):
            raw = self.finals[pos + off:pos + off + nbytes] if pos >= 0 else self.finals[:0]
            out[f.name] = self._typed(raw, f.dtype, (nf, *f.shape[1:]))
        return out

    def batches(self):
        """Per slot, a TransitionBatch of views (critic fields None when the task has none)."""
        dense = {name: self.field(name) for name in self.spec.dense_field_names()}
        for j in range(self.k):
            values = dict.fromkeys(("critic_obs", "final_critic_obs"))
            values.update({name: v[j] for name, v in dense.items()})
            values.update(self.final_rows(j))
            yield TransitionBatch(**values)

    @functools.cached_property
    def _flags(self) -> tuple[np.ndarray, np.ndarray]:
        return self.field("terminated"), self.field("truncated")

    def ended_envs(self, j: int) -> np.ndarray:
        """The envs whose episode ended at slot j (terminated | truncated), ascending."""
        terminated, truncated = self._flags
        return np.flatnonzero(terminated[j] | truncated[j])

    def flags_are_binary(self) -> bool:
        """terminated and truncated hold only 0 and 1 in every slot."""
        return not any((flags > 1).any() for flags in self._flags)

    def nonfinite(self) -> np.ndarray:
        """bool [k]: the slots with a NaN or inf in a float field, dense (obs .. rewards, with the
        padding between them) or final rows."""
        start, end = self.spec._dense_float_span
        bad = ~np.isfinite(self.dense[:, start:end].view(np.float32)).all(axis=1)
        for j in range(self.k):
            if self.offsets[j] >= 0 and not bad[j]:
                bad[j] = not all(np.isfinite(rows).all() for name, rows in self.final_rows(j).items()
                                 if name != "final_idx")
        return bad
