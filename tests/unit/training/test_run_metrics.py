"""What every run reports, and the seeds a resumed run re-resets its envs with."""
from __future__ import annotations

import numpy as np

from fastsac.common.seeds import reset_seed
from fastsac.envs.pendulum import PendulumSwingUp


def test_a_resumed_run_resets_its_envs_with_a_new_reproducible_seed():
    env = PendulumSwingUp(num_envs=16, seed=0)
    fresh = env.reset(reset_seed(7))[0].copy()
    assert reset_seed(7) == 7                                   # a fresh start is unchanged
    resumed = env.reset(reset_seed(7, start_env_steps=4096))[0].copy()
    again = env.reset(reset_seed(7, start_env_steps=4096))[0].copy()
    other = env.reset(reset_seed(7, start_env_steps=8192))[0].copy()
    restarted = env.reset(reset_seed(7, restart=1, start_env_steps=4096))[0].copy()
    assert not np.allclose(resumed, fresh), "a resumed run replays the original run's first episodes"
    np.testing.assert_array_equal(resumed, again)              # the same resume: the same observations
    assert not np.allclose(other, resumed) and not np.allclose(restarted, resumed)
