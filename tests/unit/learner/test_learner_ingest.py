"""The learner's ingest path without a running job: CollectorFeed (attach, checks, drop) and
IngestStaging (every ring's slots packed into one staging buffer, one host->device copy),
into a real ReplayBuffer. Values are stamped with (collector, slot, env), so a row that lands
in the wrong place, a torn or stale slot, or a lost final observation shows up."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsac.common.transition import TransitionBatch
from fastsac import shm_layout as L
from fastsac.algo.replay_buffer import ReplayBuffer
from fastsac.learner.feed import CollectorFeed, FeedFault
from fastsac.learner.staging import IngestStaging

HEADER_KEYS = ("weight_version", "env_step", "incarnation")
INC = 0x5EED_0000_0000_0001
NUMEL = 8
# two collectors of one job: different block sizes; 4 + 3 = 7 env rows
SPECS = [L.RingSpec(num_envs=4, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=8),
         L.RingSpec(num_envs=3, obs_dim=3, critic_obs_dim=2, act_dim=2, capacity=8)]
FIRST = [0, 4]


def batch(cid: int, k: int, spec: L.RingSpec) -> dict:
    """Slot k of collector cid. Episodes end at every third step, in a block of envs."""
    n = spec.num_envs
    env = np.arange(n, dtype=np.float32)
    nf = (k // 3) % (n + 1) if k % 3 == 0 else 0
    idx = np.arange(nf)
    done = np.zeros(n, bool)
    done[idx] = True
    base = 1000.0 * cid + k
    return dict(obs=(base + env[:, None] * 0.25 + np.zeros((n, 3))).astype(np.float32),
                critic_obs=np.full((n, 2), -base, np.float32),
                actions=np.full((n, 2), base + 0.5, np.float32), rewards=(base + env * 0.125).astype(np.float32),
                terminated=done & (np.arange(n) % 2 == 0), truncated=done & (np.arange(n) % 2 == 1),
                final_idx=idx, final_obs=(base + 0.75 + idx[:, None] + np.zeros((nf, 3))).astype(np.float32),
                final_critic_obs=np.full((nf, 2), base + 0.875, np.float32),
                weight_version=0, env_step=k + 1, incarnation=1)


class Job:
    """Two producers (the collectors' side) and the learner's two feeds, without a control block."""

    def __init__(self, job: str):
        self.prods = [L.TransitionRing.create(job, c, SPECS[c], INC) for c in (0, 1)]
        self.snaps = [L.WeightSnapshot.create(job, c, NUMEL, INC) for c in (0, 1)]
        self.feeds = [CollectorFeed(job, c, FIRST[c], SPECS[c].num_envs, SPECS[c], NUMEL) for c in (0, 1)]
        assert all(f.try_attach(collector_incarnation=1) for f in self.feeds)
        self.pushed = [0, 0]

    def push(self, cid: int, n: int) -> None:
        for _ in range(n):
            b = batch(cid, self.pushed[cid], SPECS[cid])
            assert self.prods[cid].try_push(TransitionBatch(**{k: v for k, v in b.items() if k not in HEADER_KEYS}),
                                            b["weight_version"], b["env_step"], b["incarnation"])
            self.pushed[cid] += 1

    def close(self) -> None:
        for x in (*self.feeds, *self.prods, *self.snaps):
            x.close()


@pytest.fixture
def job(job_name):
    j = Job(job_name)
    yield j
    j.close()


def stage_round(staging: IngestStaging, feeds, max_slots: int):
    """One ingest round as the learner runs it: take, validate, release, one copy."""
    staging.begin()
    runs = []
    for feed in feeds:
        if feed.available():
            run = staging.take(feed, max_slots)
            assert feed.validate(run.slots, 1) == 0
            feed.ring.release(run.k)
            runs.append(run)
    staging.send()
    return runs


def test_rows_of_two_rings_land_in_the_buffer_intact_across_wrap_around(job):
    staging = IngestStaging(SPECS, max_slots=6, device=torch.device("cpu"))
    buf = ReplayBuffer(num_envs=7, buffer_size=64, obs_dim=3, critic_obs_dim=2, act_dim=2, n_steps=1, gamma=0.9,
                       device=torch.device("cpu"))
    seen = [0, 0]
    for rnd, (a, b) in enumerate([(5, 2), (6, 7), (3, 8), (7, 1)]):   # 21 and 18 slots through 8-slot rings
        job.push(0, a)
        job.push(1, b)
        while job.feeds[0].available() or job.feeds[1].available():
            copies = staging.copies
            runs = stage_round(staging, job.feeds, 3)
            assert staging.copies == copies + 1, "one host->device copy per round, for every ring together"
            for run in runs:
                cid = run.feed.cid
                for j, s in enumerate(staging.slots(run)):
                    exp = batch(cid, seen[cid], SPECS[cid])
                    for name, value in s.items():
                        np.testing.assert_array_equal(value.numpy(), exp[name], err_msg=f"c{cid} slot {seen[cid]} {name}")
                    buf.extend(run.feed.rows, s)
                    seen[cid] += 1
    assert seen == job.pushed == [21, 18]
    # the buffer's rows hold each collector's stamps in its own block, in order
    for cid in (0, 1):
        rows = slice(FIRST[cid], FIRST[cid] + SPECS[cid].num_envs)
        actions = buf.actions[rows, :seen[cid], 0]
        np.testing.assert_array_equal(actions.numpy(), 1000.0 * cid + np.arange(seen[cid]) + 0.5 + np.zeros((SPECS[cid].num_envs, 1)))


def test_only_used_bytes_are_staged(job):
    """Dense parts plus the final rows that episodes used: no slot's reserved space."""
    staging = IngestStaging(SPECS, max_slots=8, device=torch.device("cpu"))
    job.push(0, 2)           # slot 0 has num_final 0, slot 1 too
    stage_round(staging, job.feeds, 8)
    assert staging.used == 2 * SPECS[0].dense_nbytes < 2 * SPECS[0].slot_nbytes


# --------------------------------------------------------------------------- what a faulty collector can do

def _corrupt_and_check(job, corrupt, match: str) -> None:
    job.push(0, 3)
    corrupt(job.prods[0])
    staging = IngestStaging(SPECS, max_slots=8, device=torch.device("cpu"))
    feed = job.feeds[0]
    with pytest.raises(FeedFault, match=match):
        staging.begin()
        run = staging.take(feed, 8)
        if feed.validate(run.slots, 1):
            raise FeedFault("non-finite")


def test_a_write_cursor_moved_past_the_capacity_is_a_fault(job):
    def jump(prod):
        prod._wc[0] += 1000
    _corrupt_and_check(job, jump, r"cursor distance 1003 is outside 0..8")


def test_stale_slots_announced_by_a_moved_cursor_are_a_fault(job):
    """The cursor stays within the capacity, but the slots it announces were never written for it."""
    job.push(0, 8)      # a full lap, consumed: the next cursor values point at first-lap slots
    staging = IngestStaging(SPECS, max_slots=8, device=torch.device("cpu"))
    run = stage_round(staging, [job.feeds[0]], 8)
    assert run[0].k == 8
    job.prods[0]._wc[0] += 4          # "4 new slots": they hold seq 0..3 from the first lap
    with pytest.raises(FeedFault, match=r"slot 8 is stamped seq 0 \(stale or duplicated data\)"):
        staging.begin()
        r = staging.take(job.feeds[0], 8)
        job.feeds[0].validate(r.slots, 1)


def test_an_all_ones_slot_is_a_fault(job):
    def garbage(prod):
        prod._slots_u8[1][:] = 0xFF
    _corrupt_and_check(job, garbage, r"slot 1 is stamped seq -1")


def test_an_incarnation_the_collector_never_had_is_a_fault(job):
    def future(prod):
        prod._slots[2].incarnation = 7
    _corrupt_and_check(job, future, r"slot 2 has incarnation 7; the collector is at 1")


def test_final_rows_that_do_not_match_the_ended_episodes_are_a_fault(job):
    def unflag(prod):
        prod._slots[0].truncated[0] = 1    # an episode ended, but slot 0 has no final row for it
    _corrupt_and_check(job, unflag, r"slot 0: its final rows do not list exactly the envs whose episode ended")


@pytest.mark.parametrize("field", ["rewards", "obs", "critic_obs"])
def test_non_finite_values_are_counted_and_never_staged_for_the_buffer(job, field):
    job.push(0, 3)
    getattr(job.prods[0]._slots[1], field)[...] = np.inf if field == "obs" else np.nan
    staging = IngestStaging(SPECS, max_slots=8, device=torch.device("cpu"))
    staging.begin()
    run = staging.take(job.feeds[0], 8)
    assert job.feeds[0].validate(run.slots, 1) == 1


def test_a_dropped_feed_reattaches_only_to_a_newer_incarnation(job, job_name):
    feed = job.feeds[1]
    feed.drop(collector_incarnation=2)
    assert feed.ring is None and feed.faults == 1
    assert not feed.try_attach(collector_incarnation=2)
    assert feed.try_attach(collector_incarnation=3) and feed.dropped_incarnation is None
