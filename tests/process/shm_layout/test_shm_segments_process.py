"""Segments: names, header validation, liveness, stale detection and removal, space
reservation, the memory-order guard, and the control block (roles, stats seqlock)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from support.shm_segments import exists

from fastsac import shm_layout as L

SPEC = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=4)
INC = 0x5EED_0000_0000_0007


@pytest.mark.process
def test_incarnation_mismatch_is_an_earlier_launch(job_name):
    L.TransitionRing.create(job_name, 0, SPEC, INC).close()
    with pytest.raises(L.ShmLayoutError, match="belongs to job incarnation 0x5eed000000000007 but the running job is "
                                               "incarnation 0x1: it is left over from an earlier launch"):
        L.TransitionRing.attach(job_name, 0, SPEC, "consumer", incarnation=1)


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
