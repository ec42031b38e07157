"""Test-only envs for the memory checks (tests/process/launch/test_env_memory_process.py), used as
`env.name: memory_envs:FatPendulum` / `memory_envs:GrowingPendulum` with tests/support/fault_hooks on
PYTHONPATH.

FatPendulum: a pendulum whose every env holds FAT_BYTES_PER_ENV of touched memory, the way an
EnvPool Playground task holds ~190 MB per env. GrowingPendulum: a pendulum whose block of
GROW_FROM_ENVS envs or more (a collector's, not the launcher's one-env probe) allocates
GROW_BYTES_PER_STEP more at every step, until the kernel's OOM killer ends it.
"""
from __future__ import annotations

import numpy as np

from fastsac.envs.pendulum import PendulumSwingUp

FAT_BYTES_PER_ENV = 8 * 2**20
GROW_FROM_ENVS = 16
GROW_BYTES_PER_STEP = 128 * 2**20


class FatPendulum(PendulumSwingUp):
    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        super().__init__(num_envs, seed, first_env_id, max_episode_steps, num_threads)
        self._fat = np.ones((num_envs, FAT_BYTES_PER_ENV), np.uint8)     # ones: every page touched


class GrowingPendulum(PendulumSwingUp):
    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        super().__init__(num_envs, seed, first_env_id, max_episode_steps, num_threads)
        self._held: list[np.ndarray] = []

    def step(self, actions: np.ndarray):
        if self.num_envs >= GROW_FROM_ENVS:
            self._held.append(np.ones(GROW_BYTES_PER_STEP, np.uint8))
        return super().step(actions)
