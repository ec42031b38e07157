"""Batched MuJoCo envs: many independent simulations of one model, stepped in C.

Every env of a shard owns one `mujoco.MjData`; all share one `MjModel`. A step
writes each env's controls, calls `mj_step(model, data, frame_skip)` (plus
`mj_rnePostConstraint` for tasks that read contact forces) for every env, and
copies the fields a task needs into batched numpy arrays; observations, rewards
and terminations are then computed for the whole batch in numpy.

That is exactly the call sequence of Gymnasium's `MujocoEnv` (v5), so states,
observations and rewards match a Gymnasium env stepped from the same state (up to
the summation order of numpy reductions). The speed-up over Gymnasium's
`SyncVectorEnv` comes from dropping its per-env Python: wrappers, info dicts,
observation concatenation, per-env reward code.

Threading: `num_threads` > 1 steps contiguous chunks of envs on a thread pool;
MuJoCo releases the GIL inside `mj_step`, so physics runs in parallel and only the
few microseconds of per-env Python (setting ctrl, copying fields) serialize.
Results do not depend on the number of threads (each env is stepped by exactly the
same calls on its own MjData).

mujoco is an optional dependency: it is imported when an env is built, never when
this module or the registry is imported. The model files come from the installed
gymnasium package (its `envs/mujoco/assets`), read without importing
`gymnasium.envs.mujoco` (which would also need imageio).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from fastsac.config import ConfigError
from fastsac.envs.base import StepResult, VecEnv, env_seed_sequence

# Warnings MuJoCo prints (to stderr, and appended to MUJOCO_LOG.TXT in the cwd) while
# compiling Gymnasium's model files that say nothing about the simulation.
# half_cheetah.xml uses <compiler settotalmass=...>, deprecated in MuJoCo 4: one
# such line per model load (Gymnasium: per env) otherwise.
_BENIGN_COMPILE_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def require_mujoco(env_name: str):
    """Import and return the mujoco module, or raise a ConfigError naming the extra."""
    try:
        return importlib.import_module("mujoco")
    except ImportError as exc:
        raise ConfigError(f"env.name {env_name!r} needs the optional dependency mujoco: "
                          f"pip install 'fastsac[mujoco]' ({exc})") from None


def gymnasium_asset(env_name: str, xml_file: str) -> str:
    """Path of a model file of the installed gymnasium package (no download, no import)."""
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"env.name {env_name!r} needs the optional dependency gymnasium, which ships the "
                          f"model file {xml_file}: pip install 'fastsac[mujoco]'")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "envs", "mujoco", "assets", xml_file)
        if os.path.isfile(path):
            return path
    raise ConfigError(f"env.name {env_name!r}: the installed gymnasium has no envs/mujoco/assets/{xml_file}; "
                      f"install gymnasium>=1.0: pip install 'fastsac[mujoco]'")


@contextlib.contextmanager
def quiet_mujoco_compile(mujoco, benign: tuple[str, ...] = _BENIGN_COMPILE_WARNINGS):
    """Drop known-benign MuJoCo warnings while compiling a model; re-raise others as Python warnings.

    MuJoCo's default warning handler prints to stderr and appends to MUJOCO_LOG.TXT in the
    current directory. The handler is process-global: it is installed only around the
    compile and the previous one restored afterwards.
    """
    caught: list[str] = []
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(caught.append)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)
        for msg in caught:
            if not any(b in msg for b in benign):
                warnings.warn(f"MuJoCo: {msg}", RuntimeWarning, stacklevel=3)


def load_gymnasium_model(env_name: str, xml_file: str):
    """(mujoco module, MjModel) for one of Gymnasium's model files."""
    mujoco = require_mujoco(env_name)
    path = gymnasium_asset(env_name, xml_file)
    with quiet_mujoco_compile(mujoco):
        model = mujoco.MjModel.from_xml_path(path)
    return mujoco, model


class MujocoVecEnv(VecEnv):
    """Base class of the batched MuJoCo tasks (Gymnasium v5 definitions).

    A subclass sets the class attributes below (model file, frame skip, reset noise, the
    MjData fields it reads) and implements `_observe_rows`, `_pre_step` and
    `_reward_terminated` on the gathered batch fields (`self.f[name]`, float64 [N, ...]).
    """

    env_name: str = ""
    xml_file: str = ""
    frame_skip: int = 5
    default_max_episode_steps: int = 1000
    reset_noise_scale: float = 0.1
    qvel_noise: str = "normal"      # "normal": scale * N(0, 1); "uniform": U(-scale, scale)
    rne_post_constraint: bool = True  # Gymnasium always calls it; only cfrc_ext/cacc/cfrc_int readers need it
    # name -> function(mjdata) -> view of the part of an MjData field the task reads
    fields: dict[str, Callable[[Any], np.ndarray]] = {}

    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self._mj, self.model = load_gymnasium_model(self.env_name, self.xml_file)
        mj, m = self._mj, self.model
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or self.default_max_episode_steps
        self.dt = float(m.opt.timestep) * self.frame_skip
        self.act_dim = int(m.nu)
        # Gymnasium: Box(actuator_ctrlrange) as float32
        self.action_low = m.actuator_ctrlrange[:, 0].astype(np.float32)
        self.action_high = m.actuator_ctrlrange[:, 1].astype(np.float32)
        self._first_env_id = first_env_id
        self._datas = [mj.MjData(m) for _ in range(num_envs)]
        self.init_qpos = self._datas[0].qpos.copy()  # Gymnasium: data.qpos of a fresh MjData (= qpos0)
        self.init_qvel = self._datas[0].qvel.copy()
        self._ctrl_views = [d.ctrl for d in self._datas]
        # per field: (batch buffer, list of per-env views into each MjData)
        self.f: dict[str, np.ndarray] = {}
        self._gather: list[tuple[np.ndarray, list[np.ndarray]]] = []
        for name, get in self.fields.items():
            views = [get(d) for d in self._datas]
            buf = np.zeros((num_envs, *views[0].shape), np.float64)
            self.f[name] = buf
            self._gather.append((buf, views))
        self._actions = np.zeros((num_envs, self.act_dim), np.float64)
        self.steps = np.zeros(num_envs, np.int64)
        self.num_threads = max(1, min(int(num_threads), num_envs))
        self._pool: ThreadPoolExecutor | None = None
        if self.num_threads > 1:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=f"{self.env_name}-physics")
            # a few chunks per thread: contact-rich envs cost more, small chunks balance the load
            n_chunks = min(num_envs, 4 * self.num_threads)
            bounds = np.linspace(0, num_envs, n_chunks + 1).astype(int)
            self._chunks = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        self._rngs: list[np.random.Generator] = []
        self.obs_dim = int(self._observe_rows(np.arange(1)).shape[1])
        self.reset(seed)

    # ------------------------------------------------------------------ task hooks

    def _observe_rows(self, idx: np.ndarray | slice) -> np.ndarray:
        """float64 observations [len(idx), obs_dim] from the gathered fields."""
        raise NotImplementedError

    def _pre_step(self) -> Any:
        """Quantities read before the physics step (e.g. the x position), from the gathered fields."""
        return None

    def _reward_terminated(self, pre: Any, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(reward float64 [N], terminated bool [N]) after the step."""
        raise NotImplementedError

    # ------------------------------------------------------------------ physics

    def _step_range(self, lo: int, hi: int) -> None:
        mj, m, fs = self._mj, self.model, self.frame_skip
        step, post = mj.mj_step, (mj.mj_rnePostConstraint if self.rne_post_constraint else None)
        datas, ctrl, act = self._datas, self._ctrl_views, self._actions
        for i in range(lo, hi):
            d = datas[i]
            ctrl[i][:] = act[i]
            step(m, d, fs)
            if post is not None:
                post(m, d)
        for buf, views in self._gather:
            buf[lo:hi] = views[lo:hi]

    def _physics_step(self) -> None:
        if self._pool is None:
            self._step_range(0, self.num_envs)
        else:
            for fut in [self._pool.submit(self._step_range, lo, hi) for lo, hi in self._chunks]:
                fut.result()

    def _reset_envs(self, idx: np.ndarray) -> None:
        """Gymnasium's MujocoEnv.reset + reset_model for each env in idx, then gather those rows."""
        mj, m, s = self._mj, self.model, self.reset_noise_scale
        nq, nv = self.init_qpos.size, self.init_qvel.size
        for i in idx:
            d, rng = self._datas[i], self._rngs[i]
            mj.mj_resetData(m, d)
            qpos = self.init_qpos + rng.uniform(low=-s, high=s, size=nq)
            if self.qvel_noise == "uniform":
                qvel = self.init_qvel + rng.uniform(low=-s, high=s, size=nv)
            else:
                qvel = self.init_qvel + s * rng.standard_normal(nv)
            d.qpos[:] = qpos
            d.qvel[:] = qvel
            mj.mj_forward(m, d)
        for buf, views in self._gather:
            buf[idx] = [views[i] for i in idx]
        self.steps[idx] = 0

    # ------------------------------------------------------------------ VecEnv

    def reset(self, seed: int):
        self._rngs = [np.random.default_rng(s) for s in env_seed_sequence(seed, self._first_env_id, self.num_envs)]
        self._reset_envs(np.arange(self.num_envs))
        return self._observe_rows(slice(None)).astype(np.float32), None

    def step(self, actions: np.ndarray) -> StepResult:
        a = np.asarray(actions, np.float64).reshape(self.num_envs, self.act_dim)
        np.clip(a, self.action_low, self.action_high, out=self._actions)
        pre = self._pre_step()
        self._physics_step()
        reward, terminated = self._reward_terminated(pre, self._actions)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        final_obs = self._observe_rows(slice(None)).astype(np.float32)
        done_idx = np.flatnonzero(terminated | truncated)
        if done_idx.size:
            self._reset_envs(done_idx)
            obs = final_obs.copy()
            obs[done_idx] = self._observe_rows(done_idx)
        else:
            obs = final_obs
        return StepResult(obs=obs, critic_obs=None, reward=reward.astype(np.float32),
                          terminated=terminated, truncated=truncated,
                          final_obs=final_obs, final_critic_obs=None)

    # ------------------------------------------------------------------ state access (tests, tools)

    def get_state(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(qpos, qvel) copies of env i."""
        d = self._datas[i]
        return d.qpos.copy(), d.qvel.copy()

    def set_state(self, i: int, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """Put env i in state (qpos, qvel): mj_resetData, then what Gymnasium's MujocoEnv.set_state does
        (write qpos/qvel, mj_forward). Restarts its episode step count; returns its observation."""
        mj, d = self._mj, self._datas[i]
        mj.mj_resetData(self.model, d)
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        mj.mj_forward(self.model, d)
        for buf, views in self._gather:
            buf[i] = views[i]
        self.steps[i] = 0
        return self._observe_rows(np.array([i]))[0].astype(np.float32)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
