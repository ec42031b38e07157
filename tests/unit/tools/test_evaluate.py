"""fastsac-eval through its CLI on checkpoints of tiny real pendulum runs (sync and async: the same
format): deterministic episodes on fresh envs, reproducible per seed, and exit 2 with a clear
message for a missing or corrupt checkpoint, an env of other dimensions and --video without its
file (the videos themselves: tests/process/tools/test_video_process.py); run_eval_episodes'
before_step hook sees every step of every counted episode and changes nothing.
"""
from __future__ import annotations

import numpy as np


def test_before_step_sees_each_counted_step_and_changes_nothing():
    """run_eval_episodes' hook (fastsac-eval --video films with it) is called before every step with
    each env's count of finished episodes: env i's count is 0 for exactly its first episode's
    length, also when every env plays two episodes."""
    import torch

    from fastsac.envs.registry import make_env
    from fastsac.evaluation.episodes import run_eval_episodes
    from fastsac.tools.evaluate import deterministic_actions

    def run_episodes(actor, env, seed, before_step=None, per_env=1):
        return run_eval_episodes(deterministic_actions(actor), env, seed, per_env * env.num_envs,
                                 before_step=before_step)

    class Actor(torch.nn.Module):          # a fixed policy that depends on the observation
        def forward(self, obs):
            return 2.0 * torch.tanh(obs[:, 2:3] - obs[:, 1:2])

    env = make_env("pendulum", 3, seed=0, max_episode_steps=30)
    try:
        plain = run_episodes(Actor(), env, 4)
        seen = []
        hooked = run_episodes(Actor(), env, 4, before_step=lambda done: seen.append(done.copy()))
        seen_twice = []
        twice = run_episodes(Actor(), env, 4, before_step=lambda done: seen_twice.append(done.copy()), per_env=2)
    finally:
        env.close()
    np.testing.assert_array_equal(plain[0], hooked[0])
    np.testing.assert_array_equal(plain[1], hooked[1])
    np.testing.assert_array_equal(np.sum(np.array(seen) == 0, axis=0), hooked[1])
    assert (seen[0] == 0).all() and len(seen) == 30
    first_lengths = twice[1][::2]          # env order: env 0's two episodes, then env 1's, ...
    np.testing.assert_array_equal(np.sum(np.array(seen_twice) == 0, axis=0), first_lengths)
    assert len(seen_twice) == 60
