"""`gymnasium:<id>` envs through GymnasiumVecEnv, and the built-in pendulum against Gymnasium's."""
import sys

import numpy as np
import pytest

from fastsac.common.seeds import env_seed_sequence
from fastsac.config import ConfigError
from fastsac.envs.pendulum import PendulumSwingUp
from fastsac.envs.registry import make_env


@pytest.fixture(scope="module")
def gym():
    gym = pytest.importorskip("gymnasium", reason="needs gymnasium: pip install 'fastsac[mujoco]'")
    if not hasattr(gym.vector, "AutoresetMode"):
        pytest.skip(f"the adapter needs gymnasium >= 1.1 (AutoresetMode); installed {gym.__version__}")
    return gym


def test_pendulum_dims_and_bounds(gym):
    env = make_env("gymnasium:Pendulum-v1", 3, seed=0)
    try:
        assert (env.obs_dim, env.critic_obs_dim, env.act_dim, env.max_episode_steps) == (3, 0, 1, 200)
        np.testing.assert_array_equal(env.action_low, [-2.0])
        np.testing.assert_array_equal(env.action_high, [2.0])
        obs, critic = env.reset(0)
        assert obs.shape == (3, 3) and obs.dtype == np.float32 and critic is None
        r = env.step(np.zeros((3, 1), np.float32))
        assert r.obs.shape == r.final_obs.shape == (3, 3) and r.reward.shape == (3,) and r.reward.dtype == np.float32
        assert r.terminated.dtype == bool and r.truncated.dtype == bool
    finally:
        env.close()
    env = make_env("gymnasium:Pendulum-v1", 2, seed=0, max_episode_steps=7)
    assert env.max_episode_steps == 7
    env.close()


def test_autoreset_final_obs_is_the_true_last_obs(gym):
    """Against single Gymnasium envs seeded like the adapter's: at truncation final_obs is the last
    observation of the ended episode and obs the first of the next."""
    n, seed, first, horizon = 3, 5, 10, 6
    env = make_env("gymnasium:Pendulum-v1", n, seed=seed, first_env_id=first, max_episode_steps=horizon)
    refs = [gym.make("Pendulum-v1", max_episode_steps=horizon) for _ in range(n)]
    try:
        seeds = [int(s.generate_state(1, np.uint64)[0]) for s in env_seed_sequence(seed, first, n)]
        ref_obs = np.stack([r.reset(seed=s)[0] for r, s in zip(refs, seeds)])
        np.testing.assert_array_equal(env.reset(seed)[0], ref_obs)
        rng = np.random.default_rng(0)
        for t in range(1, 2 * horizon + 2):
            act = rng.uniform(-2, 2, (n, 1)).astype(np.float32)
            r = env.step(act)
            steps = [ref.step(a) for ref, a in zip(refs, act)]
            last = np.stack([s[0] for s in steps])
            np.testing.assert_array_equal(r.reward, np.float32([s[1] for s in steps]))
            done = np.array([s[2] or s[3] for s in steps])
            np.testing.assert_array_equal(r.truncated, [s[3] for s in steps])
            assert done.all() == (t % horizon == 0) and done.any() == done.all()
            if done.any():
                np.testing.assert_array_equal(r.final_obs, last)
                nxt = np.stack([ref.reset()[0] for ref in refs])  # continues each env's own stream
                np.testing.assert_array_equal(r.obs, nxt)
                assert not np.array_equal(r.obs, r.final_obs)
            else:
                np.testing.assert_array_equal(r.obs, last)
    finally:
        env.close()
        for ref in refs:
            ref.close()


def test_seeding_keyed_by_global_env_id(gym):
    big = make_env("gymnasium:Pendulum-v1", 6, seed=2, first_env_id=0)
    small = make_env("gymnasium:Pendulum-v1", 2, seed=2, first_env_id=3)
    other = make_env("gymnasium:Pendulum-v1", 2, seed=9, first_env_id=3)
    try:
        obs_big = big.reset(2)[0]
        np.testing.assert_array_equal(small.reset(2)[0], obs_big[3:5])
        assert not np.allclose(other.reset(9)[0], obs_big[3:5])
        assert len({row.tobytes() for row in obs_big}) == 6
    finally:
        for e in (big, small, other):
            e.close()


def test_unknown_id_is_a_config_error_with_close_ids(gym):
    with pytest.raises(ConfigError, match=r"gymnasium:Pendulm-v1.*close ids: Pendulum-v1"):
        make_env("gymnasium:Pendulm-v1", 2, seed=0)
    with pytest.raises(ConfigError, match="gymnasium:Pendulum-v9"):
        make_env("gymnasium:Pendulum-v9", 2, seed=0)


def test_discrete_action_space_is_a_config_error(gym):
    with pytest.raises(ConfigError, match=r"CartPole-v1' has action space Discrete\(2\).*continuous Box"):
        make_env("gymnasium:CartPole-v1", 2, seed=0)


def test_missing_gymnasium_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ConfigError, match=r"needs the optional dependency gymnasium"):
        make_env("gymnasium:Pendulum-v1", 2, seed=0)


def test_builtin_pendulum_matches_gymnasium_dynamics(gym):
    """fastsac's numpy pendulum (the default task) steps exactly like Gymnasium's Pendulum-v1."""
    n = 5
    ours = PendulumSwingUp(n, seed=0)
    refs = [gym.make("Pendulum-v1").unwrapped for _ in range(n)]
    rng = np.random.default_rng(3)
    theta = rng.uniform(-np.pi, np.pi, n)
    theta[0] = 3.0  # near the top, large torque: exercises the speed clip
    theta_dot = rng.uniform(-8, 8, n)
    ours.theta, ours.theta_dot = theta.copy(), theta_dot.copy()
    for ref, th, thd in zip(refs, theta, theta_dot):
        ref.reset(seed=0)
        ref.state = np.array([th, thd])
    for _ in range(25):
        u = rng.uniform(-2.5, 2.5, (n, 1)).astype(np.float32)  # also out of bounds: both clip
        r = ours.step(u)
        steps = [ref.step(a) for ref, a in zip(refs, u)]
        np.testing.assert_allclose(r.obs, np.stack([s[0] for s in steps]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(r.reward, [s[1] for s in steps], rtol=1e-5, atol=1e-5)
        assert not r.terminated.any()


def test_builtin_pendulum_reset_matches_gymnasium_distribution(gym):
    """Same generator -> same initial state: the built-in reset draws like Pendulum-v1's."""
    seed, first, n = 4, 2, 3
    obs, _ = PendulumSwingUp(n, seed=seed, first_env_id=first).reset(seed)
    for i, ss in enumerate(env_seed_sequence(seed, first, n)):
        ref = gym.make("Pendulum-v1").unwrapped
        ref.np_random = np.random.default_rng(ss)
        ref_obs, _ = ref.reset()
        np.testing.assert_allclose(obs[i], ref_obs, rtol=1e-6, atol=1e-6)


def test_termination_final_obs_on_a_mujoco_env(gym):
    """Same as above through terminations: InvertedPendulum-v5 falls within a few random steps."""
    pytest.importorskip("mujoco", reason="needs mujoco: pip install 'fastsac[mujoco]'")
    pytest.importorskip("imageio", reason="Gymnasium's MuJoCo envs import imageio: pip install 'gymnasium[mujoco]'")
    n, seed = 3, 1
    env = make_env("gymnasium:InvertedPendulum-v5", n, seed=seed)
    refs = [gym.make("InvertedPendulum-v5") for _ in range(n)]
    try:
        seeds = [int(s.generate_state(1, np.uint64)[0]) for s in env_seed_sequence(seed, 0, n)]
        np.testing.assert_array_equal(env.reset(seed)[0], np.stack([r.reset(seed=s)[0] for r, s in zip(refs, seeds)]).astype(np.float32))
        rng = np.random.default_rng(0)
        terminations = 0
        for _ in range(60):
            act = rng.uniform(-3, 3, (n, 1)).astype(np.float32)
            r = env.step(act)
            for i, (ref, a) in enumerate(zip(refs, act)):
                obs, rew, term, trunc, _ = ref.step(a)
                assert (bool(r.terminated[i]), bool(r.truncated[i])) == (term, trunc)
                assert r.reward[i] == np.float32(rew)
                if term or trunc:
                    terminations += term
                    np.testing.assert_array_equal(r.final_obs[i], obs.astype(np.float32))
                    np.testing.assert_array_equal(r.obs[i], ref.reset()[0].astype(np.float32))
                else:
                    np.testing.assert_array_equal(r.obs[i], obs.astype(np.float32))
        assert terminations > 0
    finally:
        env.close()
        for ref in refs:
            ref.close()
