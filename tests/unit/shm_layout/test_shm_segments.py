"""Segments: names, header validation, liveness, stale detection and removal, space
reservation, the memory-order guard, and the control block (roles, stats seqlock)."""
from __future__ import annotations

import mmap
import os
import platform
import time

import numpy as np
import posix_ipc
import pytest
from support.shm_segments import exists

from fastsac import shm_layout as L
from fastsac.shm_layout import segment

SPEC = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=4)
INC = 0x5EED_0000_0000_0007


class RawHeader:
    """Poke a segment's header directly, as a corrupt or foreign creator would have."""

    def __init__(self, name: str):
        shm = posix_ipc.SharedMemory(name, 0)
        self.mm = mmap.mmap(shm.fd, L.HEADER_NBYTES)
        shm.close_fd()
        self.h = np.frombuffer(self.mm, np.uint8)[:L.HEADER_DTYPE.itemsize].view(L.HEADER_DTYPE).reshape(())

    def __setitem__(self, field, value):
        self.h[field] = value

    def close(self):
        del self.h
        self.mm.close()


# --------------------------------------------------------------------------- names

@pytest.mark.parametrize("bad", ["", "a.b", "x" * 33, "a/b", "sp ace", "ä", None, 7])
def test_bad_job_names_are_rejected_with_the_value_and_the_rule(bad):
    with pytest.raises(L.ShmLayoutError) as exc:
        L.ctl_name(bad)
    assert repr(bad) in str(exc.value) and "1-32 characters from A-Z a-z 0-9 _ -" in str(exc.value)


def test_segment_names_and_parsing():
    assert L.ctl_name("job-1_A") == "/fastsac.job-1_A.ctl"
    assert L.ring_name("j", 3) == "/fastsac.j.c3.ring"
    assert L.wts_name("j", 63) == "/fastsac.j.c63.wts"
    assert L.ctl_name("x" * 32)  # 32 is allowed
    for name, parsed in [("/fastsac.j.c3.ring", ("j", L.SegmentKind.RING, 3)),
                         ("fastsac.j.c0.wts", ("j", L.SegmentKind.WTS, 0)),
                         ("fastsac.j.ctl", ("j", L.SegmentKind.CTL, -1)),
                         ("fastsac.j.c03.ring", None), ("fastsac.j.c64.ring", None),
                         ("other.j.ctl", None), ("fastsac.j.c1.ring.x", None), ("psm_abc", None)]:
        assert L.parse_segment_name(name) == parsed, name
    with pytest.raises(L.ShmLayoutError, match="collector_id 64 is not valid; expected an integer in 0..63"):
        L.ring_name("j", 64)


# --------------------------------------------------------------------------- header validation

@pytest.mark.parametrize("field,value", [("num_envs", 5), ("obs_dim", 19), ("critic_obs_dim", 0),
                                         ("act_dim", 3), ("capacity", 8)])
def test_ring_config_mismatch_names_the_field(job_name, field, value):
    ring = L.TransitionRing.create(job_name, 1, L.RingSpec(4, 17, 2, 2, 4), INC)
    try:
        spec = L.RingSpec(**{**dict(num_envs=4, obs_dim=17, critic_obs_dim=2, act_dim=2, capacity=4), field: value})
        seg_value = getattr(ring.spec, field)
        with pytest.raises(L.ShmLayoutError, match=f"^ring of collector 1: {field} is {seg_value} in the segment "
                                                   f"but {value} in the config$"):
            L.TransitionRing.attach(job_name, 1, spec, "consumer")
    finally:
        ring.close()


def test_snapshot_numel_mismatch(job_name):
    snap = L.WeightSnapshot.create(job_name, 2, 1000, INC)
    try:
        with pytest.raises(L.ShmLayoutError, match="^weight snapshot of collector 2: numel is 1000 in the segment "
                                                   "but 1001 in the config$"):
            L.WeightSnapshot.attach(job_name, 2, 1001)
    finally:
        snap.close()


@pytest.mark.parametrize("field,value,message", [
    ("magic", 0, r"is not initialized: its creator \(pid \d+\) is still creating it or died while creating it"),
    ("magic", 12345, r"is not a fastsac segment \(magic 0x3039\)"),
    ("layout_version", 99, f"layout version is 99 in the segment but {L.LAYOUT_VERSION} in this fastsac"),
    ("kind", 3, r"has kind 3, expected 2 \(RING\)"),
    ("job", b"otherjob", "job is 'otherjob' in the segment but"),
    ("collector_id", 5, "collector_id is 5 in the segment but 0 was expected"),
    ("boot_id", b"00000000-dead", "was created before the last reboot"),
    ("dtype", b"float16", "dtype is 'float16' in the segment but 'float32' in the config"),
    ("total_nbytes", 12, "size is 12 bytes in the header"),
    ("layout_digest", 7, "layout digest is 0x7 in the segment"),
    ("creator_pid", 0, "is corrupt"),
    ("created_ns", 0, "is corrupt"),
])
def test_every_header_field_is_validated(job_name, field, value, message):
    ring = L.TransitionRing.create(job_name, 0, SPEC, INC)
    ring.close()
    raw = RawHeader(L.ring_name(job_name, 0))
    raw[field] = value
    raw.close()
    with pytest.raises(L.ShmLayoutError, match=message):
        L.TransitionRing.attach(job_name, 0, SPEC, "consumer")


def test_too_small_segment(job_name):
    shm = posix_ipc.SharedMemory(L.ring_name(job_name, 0), posix_ipc.O_CREX, size=100)
    shm.close_fd()
    with pytest.raises(L.ShmLayoutError, match="is 100 bytes: too small to be a fastsac segment"):
        L.TransitionRing.attach(job_name, 0, SPEC, "consumer")


def test_missing_segments_say_what_was_looked_for(job_name):
    with pytest.raises(L.ShmLayoutError, match=f"^no job '{job_name}' is running: segment /fastsac.{job_name}.ctl "
                                               "does not exist$"):
        L.ControlBlock.attach(job_name)
    with pytest.raises(L.ShmLayoutError, match=f"ring of collector 3: segment /fastsac.{job_name}.c3.ring does not exist"):
        L.TransitionRing.attach(job_name, 3, SPEC)
    with pytest.raises(L.ShmLayoutError, match=f"weight snapshot of collector 0: segment /fastsac.{job_name}.c0.wts"):
        L.WeightSnapshot.attach(job_name, 0, 10)


# --------------------------------------------------------------------------- reservation / platform

def test_enospc_is_a_clear_error_and_leaves_nothing(job_name):
    huge = L.RingSpec(4096, 100_000, 0, 17, 1000)  # ~3 TB
    with pytest.raises(L.ShmLayoutError, match=rf"not enough shared memory for /fastsac.{job_name}.c0.ring: needs "
                                               rf"{huge.segment_nbytes:,} bytes .* but /dev/shm has [\d,]+ bytes"):
        L.TransitionRing.create(job_name, 0, huge, INC)
    assert not exists(L.ring_name(job_name, 0))


def test_enospc_from_fallocate_itself(job_name, monkeypatch):
    # Skip the statvfs pre-check: the reservation (posix_fallocate) must catch it too.
    monkeypatch.setattr(segment, "shm_free_bytes", lambda: 1 << 62)
    with pytest.raises(L.ShmLayoutError, match="not enough shared memory .* needs"):
        L.WeightSnapshot.create(job_name, 0, 1 << 40, INC)  # 8 TB
    assert not exists(L.wts_name(job_name, 0))


def test_creation_reserves_and_prefaults(job_name):
    ring = L.TransitionRing.create(job_name, 0, SPEC, INC)
    try:
        st = os.stat(os.path.join(L.SHM_DIR, ring.name.lstrip("/")))
        assert st.st_size == SPEC.segment_nbytes
        assert st.st_blocks * 512 >= SPEC.segment_nbytes  # allocated now, not at first write
    finally:
        ring.close()


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le"])
def test_non_x86_refuses_unless_overridden(job_name, monkeypatch, machine):
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.delenv(L.UNSAFE_ENV, raising=False)
    msg = f"refusing to run: the lock-free ring relies on x86-64 TSO; {machine} needs acquire/release atomics"
    with pytest.raises(L.ShmLayoutError, match=msg):
        L.TransitionRing.create(job_name, 0, SPEC, INC)
    with pytest.raises(L.ShmLayoutError, match=msg):
        L.WeightSnapshot.create(job_name, 0, 10, INC)
    with pytest.raises(L.ShmLayoutError, match=msg):
        L.TransitionRing.attach(job_name, 0, SPEC)
    assert not exists(L.ring_name(job_name, 0))
    monkeypatch.setenv(L.UNSAFE_ENV, "1")
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()


def test_rings_without_their_control_block_are_stale(job_name):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()
    L.WeightSnapshot.create(job_name, 1, 8, INC).close()
    stale = L.find_stale_segments(job_name)
    assert {s.name for s in stale} == {L.ring_name(job_name, 0), L.wts_name(job_name, 1)}
    assert all(f"control block /fastsac.{job_name}.ctl is gone" in s.reason for s in stale)
    # global scan (job=None) finds them too, and never anything of a live job
    assert {s.name for s in L.find_stale_segments()} >= {s.name for s in stale}


# --------------------------------------------------------------------------- control block

def test_control_block_layout_one_writer_per_line():
    recs = [(L.CTL_LAUNCHER, L.LAUNCHER_DTYPE, 1), (L.CTL_LEARNER, L.LEARNER_DTYPE, L.MAX_LEARNERS),
            (L.CTL_COLLECTORS, L.COLLECTOR_DTYPE, L.MAX_COLLECTORS), (L.CTL_INGEST, L.INGEST_DTYPE, L.MAX_COLLECTORS),
            (L.CTL_SUPERVISOR, L.SUPERVISOR_DTYPE, L.MAX_COLLECTORS)]
    end = L.HEADER_NBYTES
    for off, dt, n in recs:
        assert off == end and off % 64 == 0 and dt.itemsize % 64 == 0  # no cache line has two writers
        end = off + n * dt.itemsize
    assert end <= L.CTL_NBYTES and L.CTL_NBYTES % 4096 == 0
    stats_off = L.COLLECTOR_DTYPE.fields["stats_seq"][1]
    assert stats_off % 64 == 0


def test_control_block_learner_records_one_writer_each(job_name):
    """Two local learners: learner i writes its own record and the ingest records of its collectors only;
    a collector's ctl.learner is its own learner's record."""
    ctl = L.ControlBlock.create(job_name, 3, num_learners=2)
    lrn1 = L.ControlBlock.attach(job_name, "learner", learner_index=1, ingest_ids=[1], num_learners=2)
    col1 = L.ControlBlock.attach(job_name, "collector", 1, learner_index=1)
    col0 = L.ControlBlock.attach(job_name, "collector", 0)
    try:
        assert ctl.num_learners == lrn1.num_learners == 2
        lrn1.learner.update(pid=7, global_rank=3, device="cuda:1", start_env_steps=5)
        lrn1.ingest(1)["ring_fill"] = 2
        assert col1.learner["pid"] == 7 and col1.learner["device"] == "cuda:1" and col0.learner["pid"] == 0
        assert ctl.learner_record(1)["global_rank"] == 3 and ctl.ingest(1)["ring_fill"] == 2
        for rec in (lrn1.learner_record(0), lrn1.ingest(0), lrn1.ingest(2)):
            with pytest.raises(L.ShmLayoutError, match="is not written by this process"):
                rec["pid" if "pid" in rec.keys() else "ring_fill"] = 1
        with pytest.raises(L.ShmLayoutError, match="learner 2 does not exist"):
            L.ControlBlock.attach(job_name, "learner", learner_index=2)
        with pytest.raises(L.ShmLayoutError, match="num_learners"):
            L.ControlBlock.attach(job_name, "learner", num_learners=1)
    finally:
        for h in (col0, col1, lrn1):
            h.close()
        ctl.unlink()
        ctl.close()


def test_control_block_roles_enforce_single_writers(job_name):
    ctl = L.ControlBlock.create(job_name, 2)
    lrn = L.ControlBlock.attach(job_name, "learner")
    col = L.ControlBlock.attach(job_name, "collector", 1, num_collectors=2)
    obs = L.ControlBlock.attach(job_name)
    try:
        assert lrn.incarnation == ctl.incarnation and col.num_collectors == 2
        lrn.learner.update(pid=11, state=L.ProcState.RUNNING, heartbeat_ns=time.monotonic_ns(), updates_per_s=2.5)
        lrn.ingest(1)["ring_fill"] = 3
        col.collector(1).update(pid=22, env_steps=100, state=L.ProcState.RUNNING, heartbeat_ns=time.monotonic_ns())
        ctl.supervisor(1).update(cpus="0-3,8", planned_node=1, state=L.SupervisorState.RUNNING)
        assert obs.learner["updates_per_s"] == 2.5 and obs.learner["state"] == L.ProcState.RUNNING
        assert obs.ingest(1)["ring_fill"] == 3 and obs.supervisor(1)["cpus"] == "0-3,8"
        assert [obs.collector(i)["env_steps"] for i in range(2)] == [0, 100]
        assert [obs.collector(i)["state"] for i in range(2)] == [L.ProcState.EMPTY, L.ProcState.RUNNING]
        ages = obs.heartbeat_ages_s()
        assert ages[0] is None and 0 <= ages[1] < 5 and 0 <= obs.learner_heartbeat_age_s() < 5
        for rec, field in [(col.learner, "pid"), (col.collector(0), "pid"), (lrn.collector(1), "pid"),
                           (lrn.supervisor(0), "restarts"), (obs.launcher, "stop"), (ctl.learner, "pid"),
                           (ctl.ingest(0), "ring_fill")]:
            with pytest.raises(L.ShmLayoutError, match="is not written by this process"):
                rec[field] = 1
        with pytest.raises(KeyError, match="has no field 'bogus'"):
            col.collector(1)["bogus"] = 1
        with pytest.raises(KeyError):
            col.collector(1)["episodes"]  # stats are only reachable through the seqlock API
        assert not obs.stop_requested()
        with pytest.raises(L.ShmLayoutError, match="only the launcher writes the stop flag"):
            lrn.request_stop(L.StopReason.FINISHED)
        ctl.request_stop(L.StopReason.FINISHED)
        assert col.stop_requested() and col.stop_reason == L.StopReason.FINISHED
        with pytest.raises(L.ShmLayoutError, match="collector 2 does not exist"):
            obs.collector(2)
        with pytest.raises(L.ShmLayoutError, match="collector_id 2 is not valid for job .* it has 2 collectors"):
            L.ControlBlock.attach(job_name, "collector", 2)
        with pytest.raises(L.ShmLayoutError, match="num_collectors is 2 in the segment but 3 in the config"):
            L.ControlBlock.attach(job_name, "learner", num_collectors=3)
        with pytest.raises(L.ShmLayoutError, match="collector stats of 0 are written by collector 0 only"):
            col.write_collector_stats(0, {"episodes": 1})
    finally:
        for c in (lrn, col, obs):
            c.close()
        ctl.unlink()
        ctl.close()
