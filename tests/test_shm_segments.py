"""Segments: names, header validation, liveness, stale detection and removal, space
reservation, the memory-order guard, and the control block (roles, stats seqlock)."""
from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import platform
import time

import numpy as np
import posix_ipc
import pytest

from fastsac import shm_layout as L
from fastsac.shm_layout import segment

SPEC = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=4)
INC = 0x5EED_0000_0000_0007


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(L.SHM_DIR, name.lstrip("/")))


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


@pytest.mark.process
def test_incarnation_mismatch_is_an_earlier_launch(job_name):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()
    with pytest.raises(L.ShmLayoutError, match="belongs to job incarnation 0x5eed000000000007 but the running job is "
                                               "incarnation 0x1: it is left over from an earlier launch"):
        L.TransitionRing.attach(job_name, 0, SPEC, "consumer", incarnation=1)


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


# --------------------------------------------------------------------------- liveness & staleness

def launcher_main(job: str, ready, stop) -> None:
    """A launcher + collector 0 in one process: ctl, ring (producer) and snapshot."""
    ctl = L.ControlBlock.create(job, 2)
    L.TransitionRing.create(job, 0, SPEC, ctl.incarnation)
    L.WeightSnapshot.create(job, 0, 16, ctl.incarnation)
    ready.set()
    stop.wait(60)
    os._exit(0)  # like a crash: no close, no unlink


def orphan_producer_main(job: str, ready, stop) -> None:
    ring = L.TransitionRing.attach(job, 0, SPEC, "producer")
    ready.set()
    stop.wait(60)
    ring.close()


@pytest.mark.process
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_dead_launcher_leaves_stale_segments_that_are_found_and_removed(job_name, procs, how):
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    p = procs(launcher_main, job_name, ready, stop)
    assert ready.wait(30)
    names = {L.ctl_name(job_name), L.ring_name(job_name, 0), L.wts_name(job_name, 0)}

    # Alive: nothing is stale, nothing can be removed or re-created.
    assert L.job_is_alive(job_name)
    assert L.find_stale_segments(job_name) == []
    with pytest.raises(L.ShmLayoutError, match=rf"job '{job_name}' is alive \(launcher pid {p.pid} holds"):
        L.unlink_job_segments(job_name, force=True)
    with pytest.raises(L.ShmLayoutError, match=rf"already running \(launcher pid {p.pid}"):
        L.ControlBlock.create(job_name, 2)
    with pytest.raises(L.ShmLayoutError, match=f"attached by producer pid {p.pid}: collector_id 0 is taken"):
        L.TransitionRing.create(job_name, 0, SPEC, 1)
    with pytest.raises(L.ShmLayoutError, match="already exists and belongs to the running job"):
        L.WeightSnapshot.create(job_name, 0, 16, 1)
    obs = L.ControlBlock.attach(job_name)
    assert obs.launcher["launcher_pid"] == p.pid and obs.still_current()

    if how == "kill":
        p.kill()
    else:
        stop.set()
    p.join(10)
    assert not L.job_is_alive(job_name) and not obs.still_current()
    obs.close()

    stale = L.find_stale_segments(job_name)
    assert {s.name for s in stale} == names
    for s in stale:
        assert f"job '{job_name}' is dead (launcher pid {p.pid} no longer holds it; that process is gone)" in s.reason
    report = L.format_stale_report(stale)
    assert f"remove with: fastsac-launch --cleanup {job_name}" in report
    with pytest.raises(L.ShmLayoutError, match=f"job '{job_name}' is not running: its launcher .* is stale"):
        L.ControlBlock.attach(job_name)
    assert sorted(L.unlink_job_segments(job_name)) == sorted(names)
    assert not any(exists(n) for n in names) and L.find_stale_segments(job_name) == []


def test_rings_without_their_control_block_are_stale(job_name):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()
    L.WeightSnapshot.create(job_name, 1, 8, INC).close()
    stale = L.find_stale_segments(job_name)
    assert {s.name for s in stale} == {L.ring_name(job_name, 0), L.wts_name(job_name, 1)}
    assert all(f"control block /fastsac.{job_name}.ctl is gone" in s.reason for s in stale)
    # global scan (job=None) finds them too, and never anything of a live job
    assert {s.name for s in L.find_stale_segments()} >= {s.name for s in stale}


@pytest.mark.process
def test_leftovers_of_an_earlier_launch_are_stale_and_replaced(job_name):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()  # from a launch that crashed
    ctl = L.ControlBlock.create(job_name, 1)  # the new launch (removes dead-job leftovers itself)
    try:
        assert ctl.removed_stale == [L.ring_name(job_name, 0)]
        L.TransitionRing.create(job_name, 0, SPEC, INC).close()  # an old collector, still running, re-creates it
        (s,) = L.find_stale_segments(job_name)
        assert "left over from an earlier launch" in s.reason
        ring = L.TransitionRing.create(job_name, 0, SPEC, ctl.incarnation)  # replaces the stale one
        assert ring.incarnation == ctl.incarnation and L.find_stale_segments(job_name) == []
        ring.close()
        with pytest.raises(L.ShmLayoutError, match="already exists and belongs to the running job"):
            L.TransitionRing.create(job_name, 0, SPEC, ctl.incarnation)
        assert sorted(ctl.unlink()) == sorted([L.ring_name(job_name, 0), L.ctl_name(job_name)])
    finally:
        ctl.close()


@pytest.mark.process
def test_a_launcher_that_is_still_starting_keeps_a_second_launch_out(job_name):
    """Two launches of one job within microseconds: the second must not remove the first's
    brand-new control block as "stale". The launch guard (a user-private flock) decides."""
    import fcntl
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()  # a stale leftover a launch would remove
    # a first launcher between its guard and its segment
    starting = os.open(os.path.join(L.launch_lock_dir(), f"{job_name}.launch"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(starting, fcntl.LOCK_EX)
    try:
        with pytest.raises(L.LaunchLockError,
                           match=rf"^job '{job_name}' is already running \(another launcher of it is starting"):
            L.ControlBlock.create(job_name, 1)
        assert not os.path.exists(f"/dev/shm/{L.ctl_name(job_name).lstrip('/')}")  # nothing created...
        assert [s.name for s in L.find_stale_segments(job_name)] == [L.ring_name(job_name, 0)]  # ...or removed
    finally:
        os.close(starting)
    ctl = L.ControlBlock.create(job_name, 1)  # the guard is free again
    try:
        with pytest.raises(L.LaunchLockError, match=rf"already running \(launcher pid {os.getpid()};"):
            L.ControlBlock.create(job_name, 1)
    finally:
        ctl.unlink()
        ctl.close()
    L.ControlBlock.create(job_name, 1).close()  # close() released it
    L.unlink_job_segments(job_name)


@pytest.mark.process
def test_the_launch_guard_cannot_be_taken_by_another_user(job_name, tmp_path, monkeypatch):
    """The guard lives in a directory private to the user: a name in a shared namespace (the
    abstract socket the guard once was) held by someone else no longer keeps the job out, and
    a lock directory that others could write is refused with the reason."""
    import socket
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(f"\0fastsac.launch.{job_name}")   # what another local user could do
    try:
        ctl = L.ControlBlock.create(job_name, 1)
        ctl.unlink()
        ctl.close()
    finally:
        squatter.close()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert L.launch_lock_dir() == str(runtime / "fastsac")
    assert (runtime / "fastsac").stat().st_mode & 0o777 == 0o700
    (runtime / "fastsac").chmod(0o777)   # writable by everyone: someone could swap the lock file
    with pytest.raises(L.LaunchLockError, match=r"is not a private directory of uid .* mode 777"):
        L.ControlBlock.create(job_name, 1)
    assert not os.path.exists(f"/dev/shm/{L.ctl_name(job_name).lstrip('/')}")


@pytest.mark.process
def test_create_or_attach_is_what_a_restarting_collector_needs(job_name):
    ctl = L.ControlBlock.create(job_name, 1)
    try:
        ring = L.TransitionRing.create_or_attach(job_name, 0, SPEC, ctl.incarnation)  # first start: creates
        slot = ring.next_free_slot()
        slot.obs[:] = 5.0
        ring.commit()
        ring.close()  # the collector crashes
        ring = L.TransitionRing.create_or_attach(job_name, 0, SPEC, ctl.incarnation)  # restart: re-attaches
        assert ring.write_cursor == 1 and (ring._slots[0].obs == 5.0).all()
        with pytest.raises(L.ShmLayoutError, match="already has a producer"):
            L.TransitionRing.create_or_attach(job_name, 0, SPEC, ctl.incarnation)  # a second claimant
        ring.close()
        snap = L.WeightSnapshot.create_or_attach(job_name, 0, 8, ctl.incarnation)
        snap.close()
        L.WeightSnapshot.create_or_attach(job_name, 0, 8, ctl.incarnation).close()
        with pytest.raises(L.ShmLayoutError, match="already exists and belongs to the running job"):
            L.WeightSnapshot.create_or_attach(job_name, 0, 8, 12345)  # not this launch, but the job is live
    finally:
        ctl.unlink()
        ctl.close()


@pytest.mark.process
def test_orphaned_attacher_blocks_removal_unless_forced(job_name, procs):
    ctl = L.ControlBlock.create(job_name, 1)
    L.TransitionRing.create(job_name, 0, SPEC, ctl.incarnation).close()
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    p = procs(orphan_producer_main, job_name, ready, stop)
    assert ready.wait(30)
    ctl.close()  # the launcher goes away; the collector is orphaned but still attached
    try:
        (ring_stale, ctl_stale) = sorted(L.find_stale_segments(job_name), key=lambda s: s.kind != L.SegmentKind.RING)
        assert ring_stale.attached_pids == (p.pid,)
        assert f"still mapped by pid {p.pid}" in L.format_stale_report([ring_stale])
        with pytest.raises(L.ShmLayoutError, match=rf"processes are still attached \(/fastsac.{job_name}.c0.ring "
                                                   rf"by pid {p.pid}\); stop them, or pass force=True"):
            L.unlink_job_segments(job_name)
        assert len(L.unlink_job_segments(job_name, force=True)) == 2
    finally:
        stop.set()
        p.join(10)


@pytest.mark.process
def test_recreated_job_makes_old_handles_not_current(job_name):
    ctl = L.ControlBlock.create(job_name, 1)
    obs = L.ControlBlock.attach(job_name)
    ctl.unlink()
    ctl.close()
    ctl2 = L.ControlBlock.create(job_name, 1)  # a new launch under the same name
    try:
        assert not obs.still_current() and ctl2.incarnation != obs.incarnation
        obs2 = L.ControlBlock.attach(job_name)
        assert obs2.still_current()
        obs2.close()
    finally:
        obs.close()
        ctl2.close()


@pytest.mark.process
def test_cli_list_and_clean(job_name, capsys):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()
    assert L.main(["list", "--job", job_name]) == 0
    out = capsys.readouterr().out
    assert "STALE" in out and f"fastsac-launch --cleanup {job_name}" in out
    assert L.main(["clean", "--job", job_name]) == 0
    assert f"removed /fastsac.{job_name}.c0.ring" in capsys.readouterr().out
    assert not exists(L.ring_name(job_name, 0))


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
        assert obs.total_collector_env_steps() == 100
        assert obs.collector_states() == [L.ProcState.EMPTY, L.ProcState.RUNNING]
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


def stats_writer_main(job: str, ready, stop) -> None:
    ctl = L.ControlBlock.attach(job, "collector", 0)
    ready.set()
    c = 0
    names = [n for n, _ in L.STATS_FIELDS]
    while not stop.is_set():
        c += 1
        ctl.write_collector_stats(0, {n: c for n in names})
    ctl.close()


@pytest.mark.process
def test_collector_stats_are_never_read_half_updated(job_name, procs):
    ctl = L.ControlBlock.create(job_name, 1)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    p = procs(stats_writer_main, job_name, ready, stop)
    try:
        assert ready.wait(30)
        reads = busy = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            s = ctl.read_collector_stats(0)
            if s is None:
                busy += 1
                continue
            reads += 1
            assert len(set(s.values())) == 1, s  # every field from the same write
        assert reads > 100, (reads, busy)
    finally:
        stop.set()
        p.join(10)
        ctl.unlink()
        ctl.close()
