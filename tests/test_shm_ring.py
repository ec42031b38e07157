"""SPSC transition ring: layout, full-ring behaviour, restart, exclusivity, and a
cross-process stress test (>= 100k stamped slots: none lost, duplicated, reordered or torn)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from fastsac import shm_layout as L
from fastsac.common.transition import TransitionBatch

HEADER_KEYS = ("weight_version", "env_step", "incarnation")
INC = 0x1234_5678_9ABC_DEF0  # a job incarnation for tests that run without a control block
SMALL = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=16)
STRESS = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=64)


# --------------------------------------------------------------------------- stamped data

def final_rows(n: int, k):
    """(num_final, first env index) of slot k: a contiguous, ascending block of envs.

    Episodes end at every third step (0..n of them), like a real batch where most steps
    end none: both the sparse copy and its skip path are exercised.
    """
    nf = np.where(k % 3 == 0, (k // 3) % (n + 1), 0)
    return (int(nf), k % (n - int(nf) + 1)) if np.ndim(k) == 0 else (nf, k % (n - nf + 1))


class Stamper:
    """try_push arguments whose every value is derived from the slot number k.

    Values are exact in float32 (k < 2**21), so a single element from another slot
    (a torn copy) or a swapped row shows up as a mismatch. Buffers are reused so the
    stress test measures the ring, not the test's allocations.
    """

    def __init__(self, spec: L.RingSpec):
        n, self.spec = spec.num_envs, spec
        self.env = np.arange(n, dtype=np.float32)[:, None] * 0.25
        self.obs = np.empty((n, spec.obs_dim), np.float32)
        self.cobs = np.empty((n, spec.critic_obs_dim), np.float32) if spec.critic_obs_dim else None
        self.act = np.empty((n, spec.act_dim), np.float32)
        self.rew = np.empty(n, np.float32)
        self.term = np.empty(n, bool)
        self.trunc = np.empty(n, bool)
        self.fobs = np.empty((n, spec.obs_dim), np.float32)
        self.fcobs = np.empty((n, spec.critic_obs_dim), np.float32) if spec.critic_obs_dim else None
        self.rows = np.arange(n)

    def __call__(self, k: int) -> dict:
        nf, first = final_rows(self.spec.num_envs, k)
        idx = self.rows[first:first + nf]
        np.add(self.env, k, out=self.obs)
        self.act.fill(k + 0.5)
        self.rew.fill(k + 0.25)
        self.term.fill(k % 2)
        self.trunc.fill((k // 2) % 2)
        np.add(idx[:, None].astype(np.float32) * 0.125, k, out=self.fobs[:nf])
        if self.cobs is not None:
            self.cobs.fill(-k)
            self.fcobs[:nf] = k + 0.75
        return dict(obs=self.obs, critic_obs=self.cobs, actions=self.act, rewards=self.rew,
                    terminated=self.term, truncated=self.trunc, final_idx=idx, final_obs=self.fobs[:nf],
                    final_critic_obs=None if self.fcobs is None else self.fcobs[:nf],
                    weight_version=k // 7, env_step=k, incarnation=3)


def push(ring, d: dict) -> bool:
    """try_push of a stamped dict: the batch fields plus weight_version, env_step, incarnation."""
    return ring.try_push(TransitionBatch(**{k: v for k, v in d.items() if k not in HEADER_KEYS}),
                         d["weight_version"], d["env_step"], d["incarnation"])


def stamped(spec: L.RingSpec, k: int) -> dict:
    return {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in Stamper(spec)(k).items()}


def check_slot(slot: L.SlotView, spec: L.RingSpec, k: int, seq: int | None = None) -> None:
    exp = stamped(spec, k)
    nf = len(exp["final_idx"])
    assert (slot.seq, slot.env_step, slot.weight_version, slot.incarnation, slot.num_final) == \
        (k if seq is None else seq, k, k // 7, 3, nf)
    np.testing.assert_array_equal(slot.obs, exp["obs"])
    np.testing.assert_array_equal(slot.actions, exp["actions"])
    np.testing.assert_array_equal(slot.rewards, exp["rewards"])
    np.testing.assert_array_equal(slot.terminated, exp["terminated"])
    np.testing.assert_array_equal(slot.truncated, exp["truncated"])
    np.testing.assert_array_equal(slot.final_idx[:nf], exp["final_idx"])
    np.testing.assert_array_equal(slot.final_obs[:nf], exp["final_obs"])
    if spec.critic_obs_dim:
        np.testing.assert_array_equal(slot.critic_obs, exp["critic_obs"])
        np.testing.assert_array_equal(slot.final_critic_obs[:nf], exp["final_critic_obs"])


def copy_out_as_slots(cons: L.TransitionRing, max_slots: int) -> np.ndarray:
    """copy_out (the learner's path), then the packed rows put back at their slot offsets, so the
    result has the slot layout (slot_dtype) and check_staging can read it field by field."""
    spec = cons.spec
    dense = np.zeros((max_slots, spec.dense_nbytes), np.uint8)
    finals = np.zeros(max_slots * spec.slot_nbytes, np.uint8)
    k, offsets, _ = cons.copy_out(dense, finals, max_slots)
    out = np.zeros((k, spec.slot_nbytes), np.uint8)
    out[:, :spec.dense_nbytes] = dense[:k]
    for j, pos in enumerate(offsets):
        if pos >= 0:
            nf = int(L.staged_headers(dense, k)[j, L.HDR["num_final"]])
            for f, off, nbytes in spec.final_rows_layout(nf):
                out[j, f.offset:f.offset + nbytes] = finals[pos + off:pos + off + nbytes]
    return out


def check_staging(staging: np.ndarray, spec: L.RingSpec, first_k: int) -> None:
    """Vectorized check of slots first_k.. copied out with copy_out (the learner's path)."""
    s = staging.view(spec.slot_dtype()).reshape(-1)
    n = spec.num_envs
    ks = first_k + np.arange(len(s))
    kf = ks.astype(np.float32)
    h = s["header"]
    np.testing.assert_array_equal(h[:, 5], ks, err_msg="seq: slot lost, duplicated or reordered")
    np.testing.assert_array_equal(h[:, 1], ks)
    nf, first = final_rows(n, ks)
    np.testing.assert_array_equal(h[:, 2], nf)
    assert (s["obs"] == kf[:, None, None] + np.arange(n, dtype=np.float32)[None, :, None] * 0.25).all(), "torn obs"
    assert (s["critic_obs"] == -kf[:, None, None]).all(), "torn critic_obs"
    assert (s["actions"] == kf[:, None, None] + 0.5).all(), "torn actions"
    assert (s["rewards"] == kf[:, None] + 0.25).all(), "torn rewards"
    assert (s["terminated"] == (ks % 2)[:, None]).all() and (s["truncated"] == ((ks // 2) % 2)[:, None]).all()
    # sparse rows: only the first num_final of each slot are meaningful
    r = np.arange(n)[None, :]
    valid = r < nf[:, None]
    idx = first[:, None] + r
    assert (s["final_idx"] == idx)[valid].all(), "torn final_idx"
    exp = (kf[:, None] + idx.astype(np.float32) * 0.125)[:, :, None]
    assert (s["final_obs"] == exp).all(axis=2)[valid].all(), "torn final_obs"
    assert (s["final_critic_obs"] == (kf + 0.75)[:, None, None]).all(axis=2)[valid].all(), "torn final_critic_obs"


# --------------------------------------------------------------------------- child processes

def producer_main(job: str, spec: L.RingSpec, n_slots: int, start_k: int = 0, create: bool = True) -> None:
    ring = (L.TransitionRing.create(job, 0, spec, INC) if create
            else L.TransitionRing.attach(job, 0, spec, "producer"))
    stamp = Stamper(spec)
    k = start_k
    while k < start_k + n_slots:
        args = stamp(k)
        while not push(ring, args):
            time.sleep(0)  # full: yield the core to the consumer (2-core machine)
        k += 1
    ring.close()


def hold_producer_main(job: str, spec: L.RingSpec, ready, stop) -> None:
    ring = L.TransitionRing.attach(job, 0, spec, "producer")
    ready.set()
    stop.wait(30)
    ring.close()


def _attach_consumer_when_created(job: str, spec: L.RingSpec, timeout: float = 30.0) -> L.TransitionRing:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return L.TransitionRing.attach(job, 0, spec, "consumer")
        except L.ShmLayoutError as exc:
            if time.monotonic() > deadline or ("does not exist" not in str(exc) and "not initialized" not in str(exc)):
                raise
            time.sleep(0.01)


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
        assert spec.slot_dtype().itemsize == spec.slot_nbytes
        assert ("critic_obs" in spec.slot_dtype().names) == bool(spec.critic_obs_dim)
    humanoid = L.RingSpec(1024, 348, 0, 17, 4)
    assert 1400 <= humanoid.transition_nbytes() <= 1500  # ~1.4 KB per transition


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


# --------------------------------------------------------------------------- processes

@pytest.mark.process
def test_cross_process_100k_slots_in_order_and_untorn(job_name, procs):
    n_slots, spec = 100_000, STRESS
    p = procs(producer_main, job_name, spec, n_slots)
    cons = _attach_consumer_when_created(job_name, spec)
    got, peeked, t0 = 0, 0, time.monotonic()
    try:
        while got < n_slots:
            if time.monotonic() - t0 > 90:
                pytest.fail(f"only {got} of {n_slots} slots arrived in 90 s")
            if cons.available() == 0:
                if not p.is_alive() and cons.available() == 0:
                    pytest.fail(f"producer exited (code {p.exitcode}) after {got} slots")
                time.sleep(0)
                continue
            if got % 211 == 0:  # now and then take the zero-copy view path instead
                views = cons.peek(3)
                for v in views:
                    check_slot(v, spec, got)
                    got += 1
                cons.release(len(views))
                peeked += len(views)
                continue
            staged = copy_out_as_slots(cons, spec.capacity)
            check_staging(staged, spec, got)
            cons.release(len(staged))
            got += len(staged)
        p.join(10)
        assert p.exitcode == 0
        assert cons.available() == 0 and cons.write_cursor == n_slots and peeked > 0
    finally:
        cons.close()


@pytest.mark.process
def test_producer_restart_keeps_unread_slots(job_name, procs):
    spec = L.RingSpec(4, 3, 2, 2, capacity=16)
    p = procs(producer_main, job_name, spec, 5)  # creates, pushes 0..4, exits without unlink
    p.join(30)
    assert p.exitcode == 0
    cons = L.TransitionRing.attach(job_name, 0, spec, "consumer")
    try:
        cons.release(1)  # learner already took slot 0
        p = procs(producer_main, job_name, spec, 6, 5, False)  # restarted collector: attach, push 5..10
        p.join(30)
        assert p.exitcode == 0
        assert cons.available() == 10
        for v in cons.peek(10):
            check_slot(v, spec, v.seq)
        assert [v.seq for v in cons.peek(10)] == list(range(1, 11))
    finally:
        cons.close()


@pytest.mark.process
def test_second_producer_and_consumer_are_refused(job_name, procs):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    prod.close()  # collector exits: the lock is gone, the ring stays
    ready, stop = ctx.Event(), ctx.Event()
    p = procs(hold_producer_main, job_name, SMALL, ready, stop)
    assert ready.wait(30)
    try:
        with pytest.raises(L.ShmLayoutError, match=f"already has a producer \\(pid {p.pid}\\): collector_id 0 is taken"):
            L.TransitionRing.attach(job_name, 0, SMALL, "producer")
        with pytest.raises(L.ShmLayoutError, match=f"attached by producer pid {p.pid}: collector_id 0 is taken"):
            L.TransitionRing.create(job_name, 0, SMALL, INC)
        c1 = L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
        with pytest.raises(L.ShmLayoutError, match=f"already has a consumer \\(pid {os.getpid()}\\)"):
            L.TransitionRing.attach(job_name, 0, SMALL, "consumer")
        c1.close()
        L.TransitionRing.attach(job_name, 0, SMALL, "consumer").close()  # released on close
    finally:
        stop.set()
        p.join(10)
    # The holder exited: the kernel released its lock; a new producer may attach.
    L.TransitionRing.attach(job_name, 0, SMALL, "producer").close()


def test_close_with_live_views_keeps_memory_valid(job_name):
    prod = L.TransitionRing.create(job_name, 0, SMALL, INC)
    slot = prod.next_free_slot()
    prod.close()  # the mapping cannot be unmapped under a live view: no use-after-unmap
    slot.obs[:] = 1.0
    assert (slot.obs == 1.0).all()
    del slot
