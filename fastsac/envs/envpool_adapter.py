"""Any EnvPool task as a fastsac VecEnv (`env.name: envpool:<task id>`).

EnvPool (PyPI `envpool`, optional extra `fastsac[envpool]`) steps a batch of envs in C++ on
its own thread pool: MuJoCo Playground (e.g. BerkeleyHumanoidJoystickFlatTerrain-v1), the
DeepMind Control suite (e.g. HumanoidRun-v1), its Gymnasium-MuJoCo ports and more.

* Auto-reset: EnvPool resets an env on the *next* step after it ended (that step's action is
  ignored and it returns the reset observation), the only mode it has. fastsac's contract
  (fastsac.envs.base) is same-step: so after every step, the envs that ended are reset at once
  with `pool.reset(env_ids)` (a partial reset, valid in EnvPool's synchronous mode). The
  ended step's observation is the true last one and becomes `final_obs`; the reset observation
  replaces it in `obs`; the env's next step uses the policy's action. No transition crosses an
  episode boundary and no step is wasted. The reset is the one EnvPool's own auto-reset would
  make (same env RNG, same calls).
* Observations: a Box is flattened to float32. A Dict is flattened in the task's key order,
  except `privileged_state` (MuJoCo Playground's critic state, which contains the actor's
  `state`), which becomes `critic_obs`. So: Playground joystick tasks -> obs = `state`,
  critic_obs = `privileged_state`; Playground tasks with a plain Box and the DeepMind Control
  tasks (a Dict of named arrays) -> obs only, the critic sees obs.
* Seeds: EnvPool seeds each env's std::mt19937 once, at construction, from a 32-bit int, and
  takes one seed per env (`seed=[...]`). Env of global id g gets (base(seed) + g) mod 2**32,
  base(seed) a SeedSequence hash of the job seed: a function of (seed, global env id) only,
  so a split into more collectors gives the same per-env streams, and all envs of a job get
  distinct seeds (independent 32-bit hashes per env would collide: ~0.2% at 4096 envs, ~40%
  at 64k). Because seeds are fixed at construction, `reset(seed)` builds the pool; the first
  reset builds it, so a probe (dimensions only) never builds one.
* Threads: EnvPool's `num_threads` = `num_threads` (the CPUs the collector owns), at most one
  per env, not pinned: they inherit the collector's binding (see `thread_affinity_offset`).
* Time limit: max_episode_steps, else the task's own (EnvPool's `max_episode_steps`).
"""
from __future__ import annotations

import difflib
import importlib
import os

import numpy as np

from fastsac.common.seeds import envpool_env_seeds
from fastsac.envs.base import StepResult, VecEnv
from fastsac.errors import ConfigError

EXTRA_HINT = "pip install 'fastsac[envpool]'"
PRIVILEGED_KEY = "privileged_state"   # MuJoCo Playground's critic-only state
AFFINITY_MODES = ("process", "pin")   # see thread_affinity_offset


def require_envpool(task_id: str):
    try:
        return importlib.import_module("envpool")
    except ImportError as exc:
        raise ConfigError(f"env.name 'envpool:{task_id}' needs the optional dependency envpool: "
                          f"{EXTRA_HINT} (EnvPool >= 1.2.5 has wheels for Python >= 3.11) ({exc})") from None


def _check_task_id(envpool, task_id: str) -> None:
    ids = envpool.list_all_envs()
    if task_id in ids:
        return
    by_lower = {i.lower(): i for i in ids}
    close = [by_lower[c] for c in difflib.get_close_matches(task_id.lower(), list(by_lower), n=5, cutoff=0.6)]
    hint = f"; close ids: {', '.join(close)}" if close else ""
    raise ConfigError(f"env.name 'envpool:{task_id}': not an EnvPool task id{hint} "
                      f"(envpool {getattr(envpool, '__version__', '?')} has {len(ids)}: python -c "
                      "\"import envpool; print(envpool.list_all_envs())\")")


def thread_affinity_offset(num_threads: int, mode: str = "process", cpus=None, machine_cpus: int | None = None) -> int:
    """EnvPool's `thread_affinity_offset` for `num_threads` workers in this process (-1: not pinned).

    "process" (the default): -1, the workers inherit the process's affinity (the collector's
    binding) and the kernel places them within it. "pin": one worker per CPU, which EnvPool can
    only express where the process's CPUs are exactly `num_threads` consecutive ids: it pins
    worker t to CPU (offset + t) mod (the machine's CPU count), absolute ids blind to the
    process's affinity (under `numactl --physcpubind=1` an offset of 0 puts a worker on CPU 0,
    outside the binding: measured), so any other CPU set is refused. Pinning measured no faster
    than the process's affinity (docs/performance.md), hence the default.
    cpus / machine_cpus (this process's affinity / the online CPU count) are for tests.
    """
    if mode not in AFFINITY_MODES:
        raise ValueError(f"affinity mode must be one of {AFFINITY_MODES}, got {mode!r}")
    if mode == "process":
        return -1
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if not (len(cpus) == num_threads and cpus == list(range(cpus[0], cpus[0] + num_threads))
            and cpus[-1] < (machine_cpus or os.cpu_count() or 0)):
        raise ValueError(f"cannot pin {num_threads} EnvPool threads one per CPU of this process's CPUs {cpus}: "
                         "EnvPool pins worker t to CPU offset + t, so the CPUs must be that many consecutive ids")
    return cpus[0]


class EnvPoolVecEnv(VecEnv):
    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0, max_episode_steps: int = 0,
                 num_threads: int = 1, task_id: str = "", affinity: str = "process"):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        envpool = self._envpool = require_envpool(task_id)
        _check_task_id(envpool, task_id)
        where = f"env.name 'envpool:{task_id}'"
        self.task_id, self.num_envs, self._first_env_id = task_id, num_envs, first_env_id
        spec = envpool.make_spec(task_id)
        config = spec.config._asdict()
        if config.get("max_num_players", 1) != 1:
            raise ConfigError(f"{where} is a multi-player task; fastsac needs single-agent envs")
        self.max_episode_steps = int(max_episode_steps or config.get("max_episode_steps") or 0)
        if self.max_episode_steps <= 0:
            raise ConfigError(f"{where} has no time limit; set env.max_episode_steps")
        self.num_threads = max(1, min(int(num_threads), num_envs))
        self._affinity_offset = thread_affinity_offset(self.num_threads, affinity)

        import gymnasium  # an optional extra: only EnvPool tasks need it
        act = spec.action_space
        if not isinstance(act, gymnasium.spaces.Box):
            raise ConfigError(f"{where} has action space {act}; fastsac (SAC) needs a continuous Box action space")
        if not (np.all(np.isfinite(act.low)) and np.all(np.isfinite(act.high))):
            raise ConfigError(f"{where} has unbounded actions ({act}); fastsac needs finite action bounds")
        self._act_shape = act.shape
        self.act_dim = int(np.prod(act.shape))
        self.action_low = np.asarray(act.low, np.float32).reshape(-1)
        self.action_high = np.asarray(act.high, np.float32).reshape(-1)

        obs = spec.observation_space
        if isinstance(obs, gymnasium.spaces.Dict):
            sizes = {k: int(np.prod(s.shape)) for k, s in obs.spaces.items()}
        elif isinstance(obs, gymnasium.spaces.Box):
            sizes = {None: int(np.prod(obs.shape))}
        else:
            raise ConfigError(f"{where} has observation space {obs}; fastsac needs a Box or a Dict of Boxes")
        self._critic_key = PRIVILEGED_KEY if PRIVILEGED_KEY in sizes else None
        # (key, columns) of the actor's observation, in the task's order
        self._obs_parts, col = [], 0
        for key, size in sizes.items():
            if key is None or key != self._critic_key:
                self._obs_parts.append((key, slice(col, col + size)))
                col += size
        self.obs_dim = col
        self.critic_obs_dim = sizes[self._critic_key] if self._critic_key else 0
        if self.obs_dim == 0:
            raise ConfigError(f"{where}: observation space {obs} has no actor observation besides "
                              f"{PRIVILEGED_KEY!r}")
        self._pool = None
        self._pool_kwargs = dict(num_envs=num_envs, batch_size=num_envs, num_threads=self.num_threads,
                                 thread_affinity_offset=self._affinity_offset,
                                 max_episode_steps=self.max_episode_steps)

    # ------------------------------------------------------------------ observations

    def _split(self, o, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(obs, critic_obs) float32 [n, dim] from an EnvPool observation batch (array or dict)."""
        if not isinstance(o, dict):
            return np.asarray(o, np.float32).reshape(n, self.obs_dim), None
        out = np.empty((n, self.obs_dim), np.float32)
        for key, cols in self._obs_parts:
            out[:, cols] = o[key].reshape(n, -1)   # casts float64 -> float32 in the copy
        critic = np.asarray(o[self._critic_key], np.float32).reshape(n, -1) if self._critic_key else None
        return out, critic

    # ------------------------------------------------------------------ VecEnv

    def reset(self, seed: int):
        """Build the pool with the per-env seeds of `seed` (EnvPool fixes seeds at construction)
        and reset every env."""
        self.close()
        seeds = envpool_env_seeds(seed, self._first_env_id, self.num_envs)
        self._pool = self._envpool.make_gymnasium(self.task_id, seed=seeds.tolist(), **self._pool_kwargs)
        o, _ = self._pool.reset()
        return self._split(o, self.num_envs)

    def step(self, actions: np.ndarray) -> StepResult:
        pool = self._pool
        if pool is None:
            raise RuntimeError("EnvPoolVecEnv.step before reset")
        # inside the bounds by contract (fastsac.envs.base): passed as they are, like EnvPool's own users
        a = np.asarray(actions, np.float32).reshape(self.num_envs, *self._act_shape)
        o, reward, terminated, truncated, _ = pool.step(a)
        obs, critic = self._split(o, self.num_envs)
        final_obs, final_critic = obs, critic
        done_idx = np.flatnonzero(terminated | truncated).astype(np.int32)
        if done_idx.size:
            # same-step auto-reset: reset the ended envs now instead of on their next step
            ro, info = pool.reset(done_idx)
            if not np.array_equal(info["env_id"], done_idx):  # sync mode returns them in request order
                raise RuntimeError(f"EnvPool returned resets of envs {info['env_id']} for {done_idx}")
            r_obs, r_critic = self._split(ro, done_idx.size)
            obs = obs.copy()
            obs[done_idx] = r_obs
            if critic is not None:
                critic = critic.copy()
                critic[done_idx] = r_critic
        return StepResult(obs=obs, critic_obs=critic, reward=np.asarray(reward, np.float32),
                          terminated=np.asarray(terminated, bool), truncated=np.asarray(truncated, bool),
                          final_obs=final_obs, final_critic_obs=final_critic)

    def describe_stepping(self) -> str:
        where = (f"pinned to CPUs {self._affinity_offset}-{self._affinity_offset + self.num_threads - 1}"
                 if self._affinity_offset >= 0 else "on the process's CPUs")
        return f"EnvPool on {self.num_threads} thread{'s' if self.num_threads > 1 else ''}, {where}"

    def close(self) -> None:
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.close()
