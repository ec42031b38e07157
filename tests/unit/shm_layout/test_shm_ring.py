"""SPSC transition ring: layout, full-ring behaviour, restart, exclusivity, and a
cross-process stress test (>= 100k stamped slots: none lost, duplicated, reordered or torn)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from support.ring_slots import check_slot, check_staging, copy_out_as_slots, push, slot_dtype, stamped

from fastsac import shm_layout as L
from fastsac.config import Config

INC = 0x1234_5678_9ABC_DEF0  # a job incarnation for tests that run without a control block
SMALL = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=16)


# --------------------------------------------------------------------------- layout

def test_slot_layout_is_aligned_and_dense_first():
    for spec in (SMALL, L.RingSpec(1024, 348, 0, 17, 4), L.RingSpec(7, 5, 3, 1, 2)):
        fields = spec.slot_fields()
        assert [f.name for f in fields][:2] == ["header", "obs"]
        assert all(f.offset % 64 == 0 for f in fields)
        assert spec.slot_nbytes % 64 == 0 and spec.dense_nbytes % 64 == 0
        for a, b in zip(fields, fields[1:]):
            assert a.offset + a.nbytes <= b.offset, (a, b)
        sparse = [f.name for f in fields if f.offset >= spec.dense_nbytes]
        assert sparse == ["final_idx", "final_obs"] + (["final_critic_obs"] if spec.critic_obs_dim else [])
        assert slot_dtype(spec).itemsize == spec.slot_nbytes
        assert ("critic_obs" in slot_dtype(spec).names) == bool(spec.critic_obs_dim)
    humanoid = L.RingSpec(1024, 348, 0, 17, 4)
    assert 1400 <= (humanoid.dense_nbytes - L.SLOT_HEADER_NBYTES) // humanoid.num_envs <= 1500  # ~1.4 KB a transition


def test_cursors_on_their_own_cache_lines(job_name):
    offs = [L.RING_WRITE_CURSOR, L.RING_READ_CURSOR, L.RING_PRODUCER_PID, L.RING_CONSUMER_PID]
    assert all(o % 64 == 0 for o in offs) and len({o // 64 for o in offs}) == len(offs)
    assert L.DATA_OFFSET % 4096 == 0 and L.DATA_OFFSET >= max(offs) + 64
    ring = L.TransitionRing.create(job_name, 0, SMALL, INC)
    try:
        for arr in (ring._wc, ring._rc):
            assert arr.dtype == np.int64 and arr.ctypes.data % 64 == 0
        for slot in ring._slots:
            assert slot.raw.ctypes.data % 64 == 0 and slot.obs.ctypes.data % 64 == 0
    finally:
        ring.close()


def test_invalid_spec_is_rejected():
    with pytest.raises(L.ShmLayoutError, match="RingSpec.num_envs: 0"):
        L.RingSpec(0, 3, 0, 2, 4)
    with pytest.raises(L.ShmLayoutError, match="critic_obs_dim: -1"):
        L.RingSpec(1, 3, -1, 2, 4)


# --------------------------------------------------------------------------- single process

def test_push_peek_release_roundtrip(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    cons = L.TransitionRing.attach(job_name, 0, SMALL, "consumer", incarnation=INC)
    try:
        assert cons.available() == 0 and cons.peek(4) == []
        for k in range(5):
            assert push(prod, stamped(SMALL, k))
        assert cons.fill() == (5, 16) and cons.available() == 5
        views = cons.peek(3)
        assert [v.seq for v in views] == [0, 1, 2]
        for k, v in enumerate(views):
            check_slot(v, SMALL, k)
        cons.release(2)
        assert [v.seq for v in cons.peek(10)] == [2, 3, 4]
        with pytest.raises(L.ShmLayoutError, match="cannot release 4 slots, 3 are available"):
            cons.release(4)
        assert prod.producer_pid == os.getpid() and cons.consumer_pid == os.getpid()
    finally:
        prod.close(), cons.close()


def test_full_ring_refuses_and_overwrites_nothing(job_name):
    spec = L.RingSpec(4, 3, 2, 2, capacity=4)
    prod = L.TransitionRing.create(job_name, 0, spec, INC)
    cons = L.TransitionRing.attach(job_name, 0, spec, "consumer")
    try:
        for k in range(4):
            assert push(prod, stamped(spec, k))
        before = prod._slots_u8.copy()
        assert push(prod, stamped(spec, 99)) is False
        assert prod.next_free_slot() is None
        np.testing.assert_array_equal(prod._slots_u8, before)  # not one byte changed
        assert cons.fill() == (4, 4) and prod.write_cursor == 4
        for k, v in enumerate(cons.peek(4)):
            check_slot(v, spec, k)
        cons.release(1)
        assert push(prod, stamped(spec, 4))  # reuses exactly the freed slot
        assert [v.seq for v in cons.peek(4)] == [1, 2, 3, 4]
        for v in cons.peek(4):
            check_slot(v, spec, v.seq)
    finally:
        prod.close(), cons.close()


def test_zero_copy_push_and_header_setters(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    cons = L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
    try:
        slot = prod.next_free_slot()
        slot.obs[:] = 7.0
        slot.actions[:] = 1.0
        slot.final_idx[:2] = [0, 3]
        slot.final_obs[:2] = 5.0
        slot.num_final, slot.weight_version, slot.env_step, slot.incarnation = 2, 11, 12, 13
        assert cons.available() == 0  # nothing visible before commit
        prod.commit(produced_ns=42)
        (v,) = cons.peek(1)
        assert (v.num_final, v.weight_version, v.env_step, v.incarnation, v.produced_ns, v.seq) == (2, 11, 12, 13, 42, 0)
        assert (v.obs == 7).all() and list(v.final_idx[:2]) == [0, 3]
        with pytest.raises(L.ShmLayoutError, match="commit\\(\\) without next_free_slot"):
            prod.commit()
        with pytest.raises(L.ShmLayoutError, match="only the producer"):
            cons.next_free_slot()
        with pytest.raises(L.ShmLayoutError, match="only the consumer"):
            prod.peek(1)
        slot = prod.next_free_slot()
        slot.num_final = SMALL.num_envs + 1
        with pytest.raises(L.ShmLayoutError, match="num_final 5 is not in 0..4"):
            prod.commit()
        assert cons.available() == 1
    finally:
        prod.close(), cons.close()


def test_full_final_arrays_are_gathered_like_compacted(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    cons = L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
    try:
        args = stamped(SMALL, 6)  # nf = 2, idx = [0, 1]
        full = np.zeros((4, 3), np.float32)
        full[args["final_idx"]] = args["final_obs"]
        full_c = np.zeros((4, 2), np.float32)
        full_c[args["final_idx"]] = args["final_critic_obs"]
        assert push(prod, {**args, "final_obs": full, "final_critic_obs": full_c})
        check_slot(cons.peek(1)[0], SMALL, 6, seq=0)
    finally:
        prod.close(), cons.close()


def test_bad_shapes_raise_and_publish_nothing(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    try:
        args = stamped(SMALL, 6)  # nf = 2
        with pytest.raises(L.ShmLayoutError, match=r"obs has shape \(3,\)"):
            push(prod, {**args, "obs": np.zeros(3, np.float32)})  # would broadcast silently
        with pytest.raises(L.ShmLayoutError, match="final_obs has 3 rows"):
            push(prod, {**args, "final_obs": np.zeros((3, 3), np.float32)})
        assert prod.write_cursor == 0 and push(prod, args) and prod.write_cursor == 1
    finally:
        prod.close()


def test_copy_out_moves_dense_part_and_num_final_rows(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    cons = L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
    try:
        k = 0
        for _ in range(3):  # wraps around the 16-slot ring: exercises the 2-run path
            for _ in range(7):
                assert push(prod, stamped(SMALL, k))
                k += 1
            staged = copy_out_as_slots(cons, 16)
            check_staging(staged, SMALL, cons.read_cursor)
            cons.release(len(staged))
        assert cons.read_cursor == 21
    finally:
        prod.close(), cons.close()


def test_copy_into_stages_typed_slots_at_their_placement(job_name):
    """copy_into packs slots into one flat buffer; StagedSlots reads stamps, fields and final rows
    back, and a twin of the buffer (the learner's device copy) gives the same batches."""
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    cons = L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
    try:
        for k in range(7):
            assert push(prod, stamped(SMALL, k))
        buffer = np.zeros(SMALL.staging_nbytes(8) + 64, np.uint8)
        slots = cons.copy_into(buffer, 64, 8)
        assert slots.k == 7 and slots.span.dense_at == 64 and slots.span.end <= len(buffer)
        assert slots.span.end - 64 <= SMALL.staging_nbytes(7)
        assert not slots.nonfinite().any() and slots.flags_are_binary()
        twin = slots.twin(buffer.copy(), lambda dtype: dtype)
        for j, (batch, again) in enumerate(zip(slots.batches(), twin.batches())):
            exp = stamped(SMALL, j)
            assert slots.stamps(j) == (j // 7, j, len(exp["final_idx"]), 3, slots.stamps(j).produced_ns, j)
            np.testing.assert_array_equal(slots.ended_envs(j), np.flatnonzero(exp["terminated"] | exp["truncated"]))
            for name in ("obs", "critic_obs", "actions", "rewards", "final_idx", "final_obs", "final_critic_obs"):
                np.testing.assert_array_equal(getattr(batch, name), exp[name], err_msg=name)
                np.testing.assert_array_equal(getattr(again, name), exp[name], err_msg=name)
        slots.field("rewards")[3, 1] = np.nan      # a typed view writes through to the staged bytes
        assert slots.nonfinite().tolist() == [j == 3 for j in range(7)]
    finally:
        prod.close(), cons.close()


def test_job_ring_spec_is_the_rings_of_the_jobs_collectors():
    cfg = Config()
    cfg.trainer.async_options.ring_capacity = 5
    dims = SimpleNamespace(obs_dim=3, critic_obs_dim=2, act_dim=2)
    assert L.job_ring_spec(cfg, dims, 4) == L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=5)


def test_close_with_live_views_keeps_memory_valid(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    slot = prod.next_free_slot()
    prod.close()  # the mapping cannot be unmapped under a live view: no use-after-unmap
    slot.obs[:] = 1.0
    assert (slot.obs == 1.0).all()
    del slot
