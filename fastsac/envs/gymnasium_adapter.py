"""Any Gymnasium env id as a fastsac VecEnv (`env.name: gymnasium:<id>`).

Wraps `gymnasium.vector.SyncVectorEnv` in same-step autoreset mode
(`AutoresetMode.SAME_STEP`, gymnasium >= 1.1): an env whose episode ends in a step is
reset within that step, so the returned observation is the new episode's first one
and the true last observation is in `info["final_obs"]`, which becomes `final_obs`.
That is fastsac's auto-reset contract (fastsac.envs.base); Gymnasium's default
next-step mode would hand the learner a reset transition with a fake action instead.

* Box action spaces only (any shape, finite bounds; actions are passed through as
  the space's dtype). Box observations are flattened to float32; other observation
  spaces that flatten to a Box (Dict, Tuple, Discrete...) get Gymnasium's
  FlattenObservation.
* Per-env seeds: env i of the shard (global id first_env_id + i) is reset with an
  integer seed drawn from fastsac.common.seeds.env_seed_sequence, i.e. keyed by
  (seed, global env id); later episodes continue that env's own generator.
* Time limit: max_episode_steps, else the id's registered limit, else 1000.
* Gymnasium steps its envs one after another in Python: `num_threads` is accepted
  and ignored. The built-in batched tasks (humanoid, ant, halfcheetah) are the fast path.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util

import numpy as np

from fastsac.common.seeds import env_seed_sequence
from fastsac.envs.base import StepResult, VecEnv
from fastsac.errors import ConfigError

DEFAULT_MAX_EPISODE_STEPS = 1000


def _require_gymnasium(env_id: str):
    try:
        gym = importlib.import_module("gymnasium")
    except ImportError as exc:
        raise ConfigError(f"env.name 'gymnasium:{env_id}' needs the optional dependency gymnasium: "
                          f"pip install 'fastsac[mujoco]' (or pip install gymnasium) ({exc})") from None
    try:
        from gymnasium.vector import AutoresetMode  # noqa: F401  (gymnasium >= 1.1)
    except ImportError:
        raise ConfigError(f"env.name 'gymnasium:{env_id}' needs gymnasium >= 1.1 (same-step autoreset, "
                          f"gymnasium.vector.AutoresetMode); installed: {getattr(gym, '__version__', '?')}. "
                          "pip install -U 'gymnasium>=1.1'") from None
    return gym


def _close_ids(gym, env_id: str) -> str:
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=5, cutoff=0.6)
    return f" (close ids: {', '.join(close)})" if close else ""


def _spec(gym, env_id: str):
    try:
        return gym.spec(env_id)
    except gym.error.Error as exc:
        raise ConfigError(f"env.name 'gymnasium:{env_id}': {exc}{_close_ids(gym, env_id)}") from None


def _seed_int(ss: np.random.SeedSequence) -> int:
    return int(ss.generate_state(1, np.uint64)[0])


@contextlib.contextmanager
def _quiet_if_mujoco(spec):
    """Gymnasium's half_cheetah.xml makes MuJoCo 4 print a deprecation warning per env (and
    append it to MUJOCO_LOG.TXT in the cwd); silence it while building MuJoCo envs."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    if "mujoco" in entry and importlib.util.find_spec("mujoco") is not None:
        # the optional mujoco extra (mujoco_base imports it too): only MuJoCo-backed ids need it
        import mujoco
        from fastsac.envs.mujoco_base import quiet_mujoco_compile
        with quiet_mujoco_compile(mujoco):
            yield
    else:
        yield


class GymnasiumVecEnv(VecEnv):
    critic_obs_dim = 0

    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1, env_id: str = ""):
        gym = _require_gymnasium(env_id)
        # the optional extra (fastsac[mujoco], or gymnasium alone)
        from gymnasium.vector import AutoresetMode, SyncVectorEnv
        from gymnasium.wrappers import FlattenObservation

        spec = _spec(gym, env_id)
        self.env_id = env_id
        self.num_envs = num_envs
        self.max_episode_steps = int(max_episode_steps or spec.max_episode_steps or DEFAULT_MAX_EPISODE_STEPS)
        self._first_env_id = first_env_id
        where = f"env.name 'gymnasium:{env_id}'"

        def make_one(flatten: bool):
            env = gym.make(env_id, max_episode_steps=self.max_episode_steps)
            return FlattenObservation(env) if flatten else env

        # one env first: check the spaces before building the batch
        try:
            with _quiet_if_mujoco(spec):
                probe = make_one(False)
        except gym.error.Error as exc:  # DependencyNotInstalled, DeprecatedEnv, ...
            raise ConfigError(f"{where}: {exc}") from None
        except ImportError as exc:  # e.g. imageio for the MuJoCo envs
            raise ConfigError(f"{where}: Gymnasium cannot build it, a dependency is missing ({exc}); "
                              f"for the MuJoCo envs: pip install 'gymnasium[mujoco]'") from None
        try:
            act_space, obs_space = probe.action_space, probe.observation_space
        finally:
            probe.close()
        Box = gym.spaces.Box
        if not isinstance(act_space, Box):
            raise ConfigError(f"{where} has action space {act_space}; fastsac (SAC) needs a continuous Box "
                              "action space")
        if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
            raise ConfigError(f"{where} has unbounded actions ({act_space}); fastsac needs finite action bounds")
        flatten = not isinstance(obs_space, Box)
        if flatten:
            try:
                flat = gym.spaces.flatten_space(obs_space)
            except NotImplementedError:
                flat = None
            if not isinstance(flat, Box):
                raise ConfigError(f"{where} has observation space {obs_space}, which does not flatten to a Box")
            obs_space = flat

        self._act_shape = act_space.shape
        self._act_dtype = act_space.dtype
        self.act_dim = int(np.prod(act_space.shape))
        self.obs_dim = int(np.prod(obs_space.shape))
        self.action_low = act_space.low.reshape(-1).astype(np.float32)
        self.action_high = act_space.high.reshape(-1).astype(np.float32)
        with _quiet_if_mujoco(spec):
            self._venv = SyncVectorEnv([lambda: make_one(flatten) for _ in range(num_envs)],
                                       autoreset_mode=AutoresetMode.SAME_STEP)
        self.reset(seed)

    def _flat(self, obs) -> np.ndarray:
        return np.asarray(obs, np.float32).reshape(self.num_envs, self.obs_dim)

    def reset(self, seed: int):
        seeds = [_seed_int(s) for s in env_seed_sequence(seed, self._first_env_id, self.num_envs)]
        obs, _ = self._venv.reset(seed=seeds)
        return self._flat(obs), None

    def step(self, actions: np.ndarray) -> StepResult:
        a = np.asarray(actions).reshape(self.num_envs, *self._act_shape).astype(self._act_dtype, copy=False)
        obs, reward, terminated, truncated, info = self._venv.step(a)
        obs = self._flat(obs)
        final_obs = obs.copy()
        if "final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = np.asarray(info["final_obs"][i], np.float32).reshape(-1)
        return StepResult(obs=obs, critic_obs=None, reward=np.asarray(reward, np.float32),
                          terminated=np.asarray(terminated, bool), truncated=np.asarray(truncated, bool),
                          final_obs=final_obs, final_critic_obs=None)

    def close(self) -> None:
        venv, self._venv = getattr(self, "_venv", None), None
        if venv is not None:
            venv.close()
