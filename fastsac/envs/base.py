"""The vectorized env interface every task implements.

Numpy in, numpy out, no torch: envs are built inside the collector process from
(name, num_envs, seed) so nothing unpicklable ever crosses a process boundary.

Auto-reset contract: `step` returns the observation to act on next. For an env whose
episode ended this step (terminated or truncated) that is already the reset
observation, and the true last observation of the ended episode is in
`final_obs[i]` / `final_critic_obs[i]` (rows of other envs are unspecified).
Bootstrapping through a truncation needs that true final observation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StepResult:
    obs: np.ndarray               # [N, obs_dim] float32, observation to act on next (reset obs where done)
    critic_obs: np.ndarray | None  # [N, critic_obs_dim] float32, None when critic_obs_dim == 0
    reward: np.ndarray            # [N] float32
    terminated: np.ndarray        # [N] bool: true end of the MDP, no bootstrap
    truncated: np.ndarray         # [N] bool: time limit, bootstrap from final_obs
    final_obs: np.ndarray         # [N, obs_dim] float32, valid where terminated | truncated
    final_critic_obs: np.ndarray | None  # like final_obs for critic_obs


class VecEnv:
    """Base class: a batch of `num_envs` independent envs stepped together.

    Attributes every task sets in __init__:
      num_envs, obs_dim, critic_obs_dim (0 = the critic sees `obs`), act_dim,
      action_low, action_high ([act_dim] float32 bounds), max_episode_steps.
    Env i draws from its own random stream seeded from (seed, i); no two envs share one.
    """

    num_envs: int
    obs_dim: int
    critic_obs_dim: int = 0
    act_dim: int
    action_low: np.ndarray
    action_high: np.ndarray
    max_episode_steps: int

    def reset(self, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Reset all envs; returns (obs, critic_obs)."""
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> StepResult:
        """Step all envs with actions [N, act_dim] inside the action bounds."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def describe_stepping(self) -> str:
        """How the envs are stepped, for the start-up log line (e.g. "mujoco.batch on 2 threads");
        "" when there is nothing to say."""
        return ""
