"""A test-only env for tests/process/launch/test_faults.py: a pendulum whose construction takes SLOW_BUILD_S for
SLOW_FROM_ENVS envs or more (a collector's block), like 8,192 MuJoCo envs or a large EnvPool
pool; smaller instances (the launcher's and learner's one-env probes) build at once. The wait is
one blocking call, as EnvPool's C++ build is: a Python signal handler cannot cut it short.

Used as `env.name: slow_env:SlowPendulum` with tests/support/fault_hooks on PYTHONPATH.
"""
from __future__ import annotations

import time

from fastsac.envs.pendulum import PendulumSwingUp

SLOW_BUILD_S = 60.0
SLOW_FROM_ENVS = 16


class SlowPendulum(PendulumSwingUp):
    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        if num_envs >= SLOW_FROM_ENVS:
            print(f"slow_env: building {num_envs} envs ({SLOW_BUILD_S:g} s)", flush=True)
            time.sleep(SLOW_BUILD_S)
        super().__init__(num_envs, seed, first_env_id, max_episode_steps, num_threads)
