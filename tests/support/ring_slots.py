"""Stamped transition-ring slots: try_push arguments derived from the slot number, and the checks that
read them back (a slot lost, duplicated, reordered or torn shows as a mismatch)."""
from __future__ import annotations

import numpy as np

from fastsac import shm_layout as L
from fastsac.common.transition import TransitionBatch

HEADER_KEYS = ("weight_version", "env_step", "incarnation")


# --------------------------------------------------------------------------- stamped data

def slot_dtype(spec) -> np.dtype:
    """A numpy structured dtype with the slot's exact layout (itemsize == slot_nbytes), to read
    staged slots field by field."""
    fs = spec.slot_fields()
    return np.dtype({"names": [f.name for f in fs], "formats": [(f.dtype, f.shape) for f in fs],
                     "offsets": [f.offset for f in fs], "itemsize": spec.slot_nbytes})


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
            nf = L.StagedSlots(spec, dense[:k], finals, offsets).stamps(j).num_final
            for f, off, nbytes in spec.final_rows_layout(nf):
                out[j, f.offset:f.offset + nbytes] = finals[pos + off:pos + off + nbytes]
    return out


def check_staging(staging: np.ndarray, spec: L.RingSpec, first_k: int) -> None:
    """Vectorized check of slots first_k.. copied out with copy_out (the learner's path)."""
    s = staging.view(slot_dtype(spec)).reshape(-1)
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
