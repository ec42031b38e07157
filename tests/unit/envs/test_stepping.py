"""envs.stepping.act_and_step: the one env-step both trainers take (collector loop, sync trainer)."""
import numpy as np

from fastsac.envs.pendulum import PendulumSwingUp
from fastsac.envs.stepping import act_and_step


def test_warming_up_draws_uniform_actions_in_the_bounds_and_the_policy_acts_after():
    env = PendulumSwingUp(4, seed=1, max_episode_steps=3)
    obs, critic_obs = env.reset(1)
    laps = []
    res, batch = act_and_step(env, obs, critic_obs, np.random.default_rng(7), None, lap=laps.append)
    want = np.random.default_rng(7).uniform(env.action_low, env.action_high, (4, 1)).astype(np.float32)
    assert laps == ["sample_actions", "env_step"]
    assert batch.actions.dtype == np.float32 and np.array_equal(batch.actions, want)
    assert batch.obs is obs and np.array_equal(batch.rewards, res.reward) and batch.num_final == 0
    seen = []
    res2, batch2 = act_and_step(env, res.obs, res.critic_obs, np.random.default_rng(7),
                                lambda o: seen.append(o) or np.zeros((len(o), 1), np.float32))
    assert seen[0] is res.obs and not batch2.actions.any()
    _, batch3 = act_and_step(env, res2.obs, res2.critic_obs, np.random.default_rng(7), None)
    assert batch3.num_final == 4 and np.array_equal(batch3.final_idx, np.arange(4))   # truncated at 3 steps
