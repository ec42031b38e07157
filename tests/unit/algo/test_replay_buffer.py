"""ReplayBuffer: n-step windows, episode ends, per-row positions, wrap-around, drop_newest, evictions.

Every stored observation encodes (row, absolute entry index, kind) so each sampled transition
can be checked against an independent pure-Python oracle that keeps each row's full history.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastsac.common.transition import TransitionBatch
from fastsac.algo.replay_buffer import ReplayBuffer

OBS, FINAL = 0.0, 1.0        # kind: observation an action was taken in / true final observation

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # deterministic, and fast on 2 cores


def enc(row: int, a: int, kind: float = OBS, inc: int = 0) -> list[float]:
    """obs = [row, absolute index, kind, incarnation]; critic obs = 10 x obs + 1 (distinguishable)."""
    return [float(row), float(a), kind, float(inc)]


class Harness:
    def __init__(self, num_envs=4, buffer_size=8, n_steps=2, gamma=0.9, critic=True, **kw):
        self.cd = 4 if critic else 0
        self.buf = ReplayBuffer(num_envs, buffer_size, 4, self.cd, 1, n_steps, gamma, "cpu", **kw)
        self.n, self.gamma = n_steps, gamma
        self.history = [[] for _ in range(num_envs)]     # per row: list of entry dicts, never evicted
        self.inc = [0] * num_envs

    def step(self, rows: slice, terminated, truncated, rewards=None):
        ids = range(rows.start, rows.stop)
        k = len(ids)
        term = torch.as_tensor(terminated, dtype=torch.bool).reshape(k)
        trunc = torch.as_tensor(truncated, dtype=torch.bool).reshape(k)
        if rewards is None:
            rewards = [float(len(self.history[r]) % 7 + r) for r in ids]
        obs = torch.tensor([enc(r, len(self.history[r]), OBS, self.inc[r]) for r in ids])
        done = (term | trunc).nonzero().squeeze(1)
        final = torch.tensor([enc(r, len(self.history[r]), FINAL, self.inc[r]) for r in ids])[done].reshape(-1, 4)
        for j, r in enumerate(ids):
            self.history[r].append(dict(obs=obs[j].tolist(), reward=float(rewards[j]), term=bool(term[j]),
                                        done=bool(term[j] | trunc[j]), final=enc(r, len(self.history[r]), FINAL, self.inc[r])))
        c = (lambda x: 10 * x + 1) if self.cd else (lambda x: None)
        self.buf.extend(rows, TransitionBatch(obs, c(obs), obs[:, 1:2] * 0.01, torch.tensor(rewards, dtype=torch.float32),
                                              term, trunc, done, final, c(final)))

    def drop_newest(self, rows: slice):
        self.buf.drop_newest(rows)
        for r in range(rows.start, rows.stop):
            h = self.history[r]
            if not h:
                continue
            dropped = h.pop()
            if h and not h[-1]["done"]:   # predecessor becomes a truncation whose final obs is the dropped obs
                h[-1].update(done=True, term=False, final=dropped["obs"])
            self.inc[r] += 1

    def expected(self, row: int, t: int) -> dict:
        h = self.history[row]
        ret, k = 0.0, 0
        while True:
            e = h[t + k]
            ret += self.gamma ** k * e["reward"]
            if e["done"]:
                return dict(rewards=ret, discount=self.gamma ** (k + 1), bootstrap=0.0 if e["term"] else 1.0,
                            next_obs=e["final"])
            k += 1
            if k == self.n:
                return dict(rewards=ret, discount=self.gamma ** k, bootstrap=1.0, next_obs=h[t + k]["obs"])

    def check_sample(self, batch_size=4000) -> list[tuple[int, int]]:
        b = self.buf.sample(batch_size)
        keys = []
        for i in range(batch_size):
            row, t = int(b["obs"][i, 0]), int(b["obs"][i, 1])
            exp = self.expected(row, t)
            assert b["obs"][i].tolist() == self.history[row][t]["obs"]
            assert b["actions"][i, 0].item() == pytest.approx(t * 0.01)
            assert b["rewards"][i].item() == pytest.approx(exp["rewards"], rel=1e-5)
            assert b["discount"][i].item() == pytest.approx(exp["discount"], rel=1e-6)
            assert b["bootstrap"][i].item() == exp["bootstrap"]
            assert b["next_obs"][i].tolist() == exp["next_obs"], (row, t)
            if self.cd:
                assert b["critic_obs"][i].tolist() == [10 * x + 1 for x in b["obs"][i].tolist()]
                assert b["next_critic_obs"][i].tolist() == [10 * x + 1 for x in exp["next_obs"]]
            else:
                assert b["critic_obs"] is None and b["next_critic_obs"] is None
            keys.append((row, t))
        return keys


def test_nstep_termination_vs_truncation_hand_computed():
    torch.manual_seed(0)
    h = Harness(num_envs=1, buffer_size=16, n_steps=3, gamma=0.5, critic=False)
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]
    for a, r in enumerate(rewards):
        h.step(slice(0, 1), terminated=[a == 5], truncated=[a == 2], rewards=[r])
    b = h.buf.sample(3000)
    got = {}
    for i in range(3000):
        got[int(b["obs"][i, 1])] = (b["rewards"][i].item(), b["discount"][i].item(), b["bootstrap"][i].item(),
                                    b["next_obs"][i].tolist())
    assert sorted(got) == list(range(7))                # newest n=3 entries are never sampled
    # t=0: 1 + .5*2 + .25*4, window cut by the truncation at 2: bootstrap from the TRUE final obs of 2
    assert got[0] == (3.0, 0.125, 1.0, enc(0, 2, FINAL))
    assert got[1] == (2.0 + 2.0, 0.25, 1.0, enc(0, 2, FINAL))
    assert got[2] == (4.0, 0.5, 1.0, enc(0, 2, FINAL))
    # t=3: 8 + 8 + 8, termination at 5 inside the window: no bootstrap
    assert got[3] == (24.0, 0.125, 0.0, enc(0, 5, FINAL))
    assert got[5] == (32.0, 0.5, 0.0, enc(0, 5, FINAL))
    # t=6: a full window 6, 7, 8, next obs = obs of entry 9 (the successor)
    assert got[6] == (64.0 + 64.0 + 64.0, 0.125, 1.0, enc(0, 9, OBS))
    assert h.buf.size() == 10 and h.buf.num_sampleable() == 7


def test_wraparound_two_blocks_at_different_rates():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    h = Harness(num_envs=4, buffer_size=8, n_steps=2, gamma=0.9, critic=True)
    a_block, b_block = slice(0, 2), slice(2, 4)
    for step in range(20):                               # block A: 20 steps, block B: 5, interleaved
        h.step(a_block, rng.random(2) < 0.1, rng.random(2) < 0.2)
        if step % 4 == 0:
            h.step(b_block, [False, step == 8], [step == 4, False])
    assert h.buf.pos.tolist() == [20, 20, 5, 5]
    assert h.buf.row_sizes().tolist() == [8, 8, 5, 5]
    keys = h.check_sample(4000)
    seen = {}
    for row, t in keys:
        seen.setdefault(row, set()).add(t)
    assert seen[0] == seen[1] == set(range(12, 18))      # wrapped rows: entries [pos - S, pos - n)
    assert seen[2] == seen[3] == set(range(0, 3))
    per_row = np.bincount([row for row, _ in keys], minlength=4) / len(keys)
    np.testing.assert_allclose(per_row, 0.25, atol=0.04)  # rows uniform, not proportional to their size


def test_sample_before_any_row_is_ready_raises():
    h = Harness(num_envs=2, buffer_size=8, n_steps=3)
    for _ in range(3):
        h.step(slice(0, 2), [False, False], [False, False])
    assert not h.buf.ready()
    with pytest.raises(RuntimeError, match="no row holds more than n_steps"):
        h.buf.sample(4)
    h.step(slice(0, 1), [False], [False])                 # only row 0 ready: sampled alone
    assert h.buf.ready() and not h.buf._all_rows_ready
    assert {row for row, _ in h.check_sample(200)} == {0}
    h.step(slice(1, 2), [False], [False])
    assert h.buf.ready() and h.buf._all_rows_ready        # from now on without a host sync


def test_drop_newest_truncates_predecessor_and_frees_final_slot():
    torch.manual_seed(0)
    h = Harness(num_envs=3, buffer_size=16, n_steps=3, gamma=0.5, critic=True, final_obs_capacity=4)
    for a in range(6):
        h.step(slice(0, 2), [False, False], [False, a == 5])   # row 1's newest entry ended an episode
    h.step(slice(2, 3), [False], [False])                       # row 2 holds a single entry
    h.drop_newest(slice(0, 2))
    h.drop_newest(slice(2, 3))
    assert h.buf.row_sizes().tolist() == [5, 5, 0]
    assert h.buf.final_count.tolist() == [1, 1, 0]        # row 0: new truncation; row 1: slot given back + reused
    # the restarted collector writes fresh episodes (incarnation 1) into the same rows
    for a in range(4):
        h.step(slice(0, 3), [False] * 3, [False] * 3)
    keys = h.check_sample(3000)
    got = {(r, t) for r, t in keys}
    assert {(0, t) for t in range(6)} <= got               # windows through entry 4 end at its truncation
    b = h.buf.sample(500)
    for i in range(500):                                   # entry 4's successor is the dropped obs, never a reset obs
        if int(b["obs"][i, 0]) == 0 and int(b["obs"][i, 1]) in (2, 3, 4):
            assert b["next_obs"][i].tolist() == enc(0, 5, OBS, inc=0)
            assert b["bootstrap"][i].item() == 1.0


def test_final_obs_side_table_evicts_oldest_entries():
    torch.manual_seed(0)
    # K = 3 final-obs slots per row, episodes of 2 steps: every 3rd episode end evicts older entries
    h = Harness(num_envs=2, buffer_size=16, n_steps=2, gamma=0.9, critic=False, final_obs_capacity=3)
    for a in range(14):
        h.step(slice(0, 2), [a % 4 == 3, False], [a % 4 == 1, a % 2 == 1])
    # row 1: ends at 1, 3, 5, ..., 13; the 4th end (entry 7) reused the slot of entry 1, etc.
    # latest reuse: end at 13 evicted the owner entry 7, so row 1 keeps entries 8..13
    assert h.buf.start.tolist() == [8, 8]
    assert h.buf.row_sizes().tolist() == [6, 6]
    keys = h.check_sample(2000)
    assert {t for r, t in keys if r == 1} == set(range(8, 12))


def test_n_steps_must_fit_the_buffer():
    with pytest.raises(ValueError, match="n_steps"):
        ReplayBuffer(1, 4, 2, 0, 1, 4, 0.9, "cpu")
