"""One env-step of a block of envs, as both trainers take it: the collector's loop
(fastsac.collector.loop) and the synchronous trainer (fastsac.sync).

Uniform random actions within the env's bounds while warming up (no policy yet), else the
policy's actions on the current observations; then the step and the transition it made. What
happens to that transition (a ring slot, the replay buffer) is the caller's.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fastsac.common.transition import TransitionBatch
from fastsac.envs.base import StepResult, VecEnv


def act_and_step(env: VecEnv, obs: np.ndarray, critic_obs: np.ndarray | None, rng: np.random.Generator,
                 policy: Callable[[np.ndarray], np.ndarray] | None,
                 lap: Callable[[str], object] | None = None) -> tuple[StepResult, TransitionBatch]:
    """Act on `obs` (policy None: warming up, uniform random actions from rng) and step `env`: its
    StepResult and the TransitionBatch of that step. lap(stage), when given, is called after each
    stage, "sample_actions" and "env_step" (the collector times its loop's stages with it)."""
    if policy is None:
        actions = rng.uniform(env.action_low, env.action_high, (len(obs), env.act_dim)).astype(np.float32)
    else:
        actions = policy(obs)
    if lap is not None:
        lap("sample_actions")
    res = env.step(actions)
    if lap is not None:
        lap("env_step")
    return res, TransitionBatch.from_step(obs, critic_obs, actions, res)
