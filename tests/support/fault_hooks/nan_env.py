"""A test-only env for tests/process/launch/test_faults.py: pendulum that turns some observations into NaN.

Used through the registry's custom-env form `env.name: nan_env:NaNPendulum`, with this
directory (tests/support/fault_hooks) on PYTHONPATH so every process of the job (launcher, learner,
collectors) can import it. From its NAN_AT_STEP-th step on, the envs whose *global* ids are in NAN_ENV_IDS
return NaN observations; every other env stays finite.
"""
from __future__ import annotations

import numpy as np

from fastsac.envs.pendulum import PendulumSwingUp

NAN_AT_STEP = 20
NAN_ENV_IDS = (3, 6)


class NaNPendulum(PendulumSwingUp):
    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        super().__init__(num_envs, seed, first_env_id, max_episode_steps, num_threads)
        self._t = 0
        self._bad = [g - first_env_id for g in NAN_ENV_IDS if first_env_id <= g < first_env_id + num_envs]

    def step(self, actions: np.ndarray):
        res = super().step(actions)
        self._t += 1
        if self._t >= NAN_AT_STEP and self._bad:
            res.obs[self._bad] = np.nan
        return res
