"""SPSC transition ring: layout, full-ring behaviour, restart, exclusivity, and a
cross-process stress test (>= 100k stamped slots: none lost, duplicated, reordered or torn)."""
from __future__ import annotations

import os
import time

import pytest
from support.ring_slots import Stamper, check_slot, check_staging, copy_out_as_slots, push

from fastsac import shm_layout as L

INC = 0x1234_5678_9ABC_DEF0  # a job incarnation for tests that run without a control block
SMALL = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=16)
STRESS = L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=64)


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
