"""Batched pendulum swing-up: Gymnasium Pendulum-v1 equations, vectorized in numpy.

Dependency-free built-in default task. Reward = -(theta^2 + 0.1 thdot^2 + 0.001 u^2),
episodes are truncated after `max_episode_steps` (default 200) and never terminate.
A policy that swings up and balances scores about -150 per episode; random play about -1200.
"""
from __future__ import annotations

import numpy as np

from fastsac.common.seeds import env_seed_sequence
from fastsac.envs.base import StepResult, VecEnv

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
G = 10.0
MASS = 1.0
LENGTH = 1.0


class PendulumSwingUp(VecEnv):
    obs_dim = 3
    critic_obs_dim = 0
    act_dim = 1

    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or 200
        self.action_low = np.full(1, -MAX_TORQUE, np.float32)
        self.action_high = np.full(1, MAX_TORQUE, np.float32)
        self._seed, self._first_env_id = seed, first_env_id
        self._rngs: list[np.random.Generator] = []
        self.theta = np.zeros(num_envs, np.float64)
        self.theta_dot = np.zeros(num_envs, np.float64)
        self.steps = np.zeros(num_envs, np.int64)
        self.reset(seed)

    def _sample_state(self, idx: np.ndarray) -> None:
        for i in idx:
            th, thd = self._rngs[i].uniform((-np.pi, -1.0), (np.pi, 1.0))
            self.theta[i], self.theta_dot[i] = th, thd
        self.steps[idx] = 0

    def _obs(self) -> np.ndarray:
        return np.stack([np.cos(self.theta), np.sin(self.theta), self.theta_dot], axis=1).astype(np.float32)

    def reset(self, seed: int):
        self._rngs = [np.random.default_rng(s) for s in env_seed_sequence(seed, self._first_env_id, self.num_envs)]
        self._sample_state(np.arange(self.num_envs))
        return self._obs(), None

    def step(self, actions: np.ndarray) -> StepResult:
        u = np.clip(np.asarray(actions, np.float64).reshape(self.num_envs), -MAX_TORQUE, MAX_TORQUE)
        th, thd = self.theta, self.theta_dot
        angle = ((th + np.pi) % (2 * np.pi)) - np.pi
        cost = angle ** 2 + 0.1 * thd ** 2 + 0.001 * u ** 2
        new_thd = np.clip(thd + (3 * G / (2 * LENGTH) * np.sin(th) + 3.0 / (MASS * LENGTH ** 2) * u) * DT,
                          -MAX_SPEED, MAX_SPEED)
        self.theta = th + new_thd * DT
        self.theta_dot = new_thd
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        terminated = np.zeros(self.num_envs, bool)
        final_obs = self._obs()
        done_idx = np.flatnonzero(truncated)
        if done_idx.size:
            self._sample_state(done_idx)
            obs = self._obs()
        else:
            obs = final_obs
        return StepResult(obs=obs, critic_obs=None, reward=(-cost).astype(np.float32),
                          terminated=terminated, truncated=truncated,
                          final_obs=final_obs, final_critic_obs=None)
