"""A deliberately slowed task for bench_collectors.py (env.name: benchmarks.slow_env:SlowHumanoid).

The shard holding global env 0 (collector 0) sleeps twice its own step time after every
step, so that collector runs ~3x slower. The other collectors are untouched: their
throughput shows whether a slow collector holds anybody else back.
"""
from __future__ import annotations

import time

from fastsac.envs.base import VecEnv
from fastsac.envs.registry import make_env

SLOWDOWN = 3.0


class SlowHumanoid(VecEnv):
    def __init__(self, num_envs, seed, first_env_id=0, max_episode_steps=0, num_threads=1):
        self._env = make_env("humanoid", num_envs, seed, first_env_id, max_episode_steps, num_threads)
        self._slow = first_env_id == 0
        for attr in ("num_envs", "obs_dim", "critic_obs_dim", "act_dim", "action_low", "action_high",
                     "max_episode_steps"):
            setattr(self, attr, getattr(self._env, attr))

    def reset(self, seed):
        return self._env.reset(seed)

    def step(self, actions):
        t0 = time.perf_counter()
        result = self._env.step(actions)
        if self._slow:
            time.sleep((SLOWDOWN - 1.0) * (time.perf_counter() - t0))
        return result

    def close(self):
        self._env.close()

    def describe_stepping(self) -> str:
        return f"{self._env.describe_stepping()}{', slowed' if self._slow else ''}"
