"""The transition batch: one env-step of a block of envs, and the one list of its fields.

FIELDS drives everything that stores or moves transitions: the ring's slot layout
(fastsac.shm_layout.ring_layout), the collector's write into a slot, the learner's staging views and
ReplayBuffer.extend. A TransitionBatch holds numpy arrays (env, ring) or torch tensors (learner,
replay buffer) under the same names.

Next observations are not part of a batch: they are the next batch's obs, except for the envs
whose episode ended (terminated | truncated), whose true last observation is in the final_*
fields. Those hold only the rows of the envs that ended, in ascending env order listed by
final_idx; usually none.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class TransitionField:
    name: str
    dtype: np.dtype
    row: str        # per-env shape: "obs" | "critic_obs" | "act" (vectors of those dims) or "" (a scalar)
    final: bool     # True: only the rows of the envs whose episode ended (final_idx order)

    def row_shape(self, obs_dim: int, critic_obs_dim: int, act_dim: int) -> tuple[int, ...]:
        return {"obs": (obs_dim,), "critic_obs": (critic_obs_dim,), "act": (act_dim,), "": ()}[self.row]


_F32, _U8, _I64 = np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int64)
FIELDS: tuple[TransitionField, ...] = (
    TransitionField("obs", _F32, "obs", False),                  # the observation acted on
    TransitionField("critic_obs", _F32, "critic_obs", False),    # privileged critic state (if any)
    TransitionField("actions", _F32, "act", False),
    TransitionField("rewards", _F32, "", False),
    TransitionField("terminated", _U8, "", False),               # true end of the MDP: no bootstrap
    TransitionField("truncated", _U8, "", False),                # time limit: bootstrap from final_obs
    TransitionField("final_idx", _I64, "", True),                # env index of each episode that ended
    TransitionField("final_obs", _F32, "obs", True),             # its true last observation
    TransitionField("final_critic_obs", _F32, "critic_obs", True),
)


def fields_for(critic_obs_dim: int) -> tuple[TransitionField, ...]:
    """The fields a task has: the critic_obs ones only when critic_obs_dim > 0."""
    return tuple(f for f in FIELDS if critic_obs_dim or f.row != "critic_obs")


@dataclass
class TransitionBatch:
    """One env-step batch of N envs. obs/critic_obs/actions: [N, dim]; rewards, terminated,
    truncated: [N]; final_idx: [F] ascending env indices (the envs with terminated | truncated);
    final_obs / final_critic_obs: [F, dim]. critic_obs and final_critic_obs are None when the
    task has no critic observation."""
    obs: Any
    critic_obs: Any
    actions: Any
    rewards: Any
    terminated: Any
    truncated: Any
    final_idx: Any
    final_obs: Any
    final_critic_obs: Any = None

    @classmethod
    def from_step(cls, obs, critic_obs, actions, step) -> "TransitionBatch":
        """The transition of acting `actions` in `obs` (numpy), from the env's StepResult: the
        final rows are the ended envs' (step.final_obs is [N, dim]; the ring gathers the rows)."""
        final_idx = np.flatnonzero(step.terminated | step.truncated)
        return cls(obs, critic_obs, actions, step.reward, step.terminated, step.truncated, final_idx,
                   step.final_obs, step.final_critic_obs)

    def compact(self) -> "TransitionBatch":
        """The same batch with only the ended envs' rows in final_obs / final_critic_obs."""
        idx = self.final_idx
        return replace(self, final_obs=self.final_obs[idx],
                       final_critic_obs=None if self.final_critic_obs is None else self.final_critic_obs[idx])

    @property
    def num_final(self) -> int:
        return len(self.final_idx)

    def map(self, fn: Callable[[str, Any], Any]) -> "TransitionBatch":
        """A batch with fn(name, value) applied to every field that is not None."""
        return replace(self, **{f.name: fn(f.name, getattr(self, f.name))
                                for f in fields(self) if getattr(self, f.name) is not None})

    def items(self):
        return ((f.name, getattr(self, f.name)) for f in fields(self))


assert [f.name for f in FIELDS] == [f.name for f in fields(TransitionBatch)]  # one list of fields
