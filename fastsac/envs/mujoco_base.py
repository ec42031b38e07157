"""Batched MuJoCo envs: many independent simulations of one model, stepped in C.

Every env of a shard is one simulation of one shared `MjModel`. A step writes each env's
controls and makes, for every env, Gymnasium's `MujocoEnv` (v5) calls: `mj_step(model, data,
frame_skip)`, plus `mj_rnePostConstraint` for tasks that read contact forces. The fields a
task needs then sit in batched numpy arrays (`self.f`), from which observations, rewards and
terminations are computed for the whole batch in numpy.

That is exactly Gymnasium's call sequence, so states, observations and rewards match a
Gymnasium env stepped from the same state (up to the summation order of numpy reductions).
The speed-up over Gymnasium's `SyncVectorEnv` comes from dropping its per-env Python:
wrappers, info dicts, observation concatenation, per-env reward code.

The stepping itself is a backend (fastsac/envs/mujoco_physics.py): MuJoCo 4's
`mujoco.batch.Batch` (all envs in C, no GIL) for tasks that read only state fields, else a
loop over one `MjData` per env on `num_threads` threads. Results do not depend on the backend
or the number of threads.

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
from typing import Any, Callable

import numpy as np

from fastsac.common.seeds import env_seed_sequence
from fastsac.envs.base import StepResult, VecEnv
from fastsac.envs.mujoco_physics import BatchPhysics, LoopPhysics, mujoco_batch_module
from fastsac.errors import ConfigError

PHYSICS_BACKENDS = ("auto", "loop", "batch")

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

    physics: "auto" steps with `mujoco.batch` when the task allows it (`state_only`) and the
    installed MuJoCo has it, else with the per-env loop; "loop" / "batch" force one (tests).
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
    # True: `fields` are whole MjData state fields under their own names (qpos, qvel, ...) and
    # rne_post_constraint is False, so mujoco.batch can step the task
    state_only: bool = False

    def __init__(self, num_envs: int, seed: int, first_env_id: int = 0,
                 max_episode_steps: int = 0, num_threads: int = 1, physics: str = "auto"):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if physics not in PHYSICS_BACKENDS:
            raise ValueError(f"physics must be one of {PHYSICS_BACKENDS}, got {physics!r}")
        mj, self.model = load_gymnasium_model(self.env_name, self.xml_file)
        m = self.model
        self.num_envs = num_envs
        self.max_episode_steps = max_episode_steps or self.default_max_episode_steps
        self.dt = float(m.opt.timestep) * self.frame_skip
        self.act_dim = int(m.nu)
        # Gymnasium: Box(actuator_ctrlrange) as float32
        self.action_low = m.actuator_ctrlrange[:, 0].astype(np.float32)
        self.action_high = m.actuator_ctrlrange[:, 1].astype(np.float32)
        self._first_env_id = first_env_id
        fresh = mj.MjData(m)
        self.init_qpos = fresh.qpos.copy()  # Gymnasium: data.qpos of a fresh MjData (= qpos0)
        self.init_qvel = fresh.qvel.copy()
        self._actions = np.zeros((num_envs, self.act_dim), np.float64)
        self.steps = np.zeros(num_envs, np.int64)
        self.num_threads = max(1, min(int(num_threads), num_envs))
        if self.state_only and self.rne_post_constraint:
            raise TypeError(f"{type(self).__name__}: a state_only task cannot need mj_rnePostConstraint")
        batch = mujoco_batch_module() if physics != "loop" and self.state_only else None
        if physics == "batch" and batch is None:
            raise ValueError(f"{self.env_name}: physics='batch' needs a state-only task and mujoco>=4.0 "
                             f"(mujoco.batch); this is {'' if self.state_only else 'not '}a state-only task")
        if batch is not None:
            self.physics = BatchPhysics(mj, batch, m, num_envs, self.frame_skip, list(self.fields), self.num_threads)
        else:
            self.physics = LoopPhysics(mj, m, num_envs, self.frame_skip, self.rne_post_constraint, self.fields,
                                       self.num_threads, f"{self.env_name}-physics")
        self.f: dict[str, np.ndarray] = self.physics.f
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

    def _physics_step(self) -> None:
        self.physics.step(self._actions)

    def _reset_envs(self, idx: np.ndarray) -> None:
        """Gymnasium's MujocoEnv.reset + reset_model for each env in idx (same noise draws, same order)."""
        s = self.reset_noise_scale
        nq, nv = self.init_qpos.size, self.init_qvel.size
        qpos, qvel = np.empty((len(idx), nq)), np.empty((len(idx), nv))
        for row, i in enumerate(idx):
            rng = self._rngs[i]
            qpos[row] = self.init_qpos + rng.uniform(low=-s, high=s, size=nq)
            if self.qvel_noise == "uniform":
                qvel[row] = self.init_qvel + rng.uniform(low=-s, high=s, size=nv)
            else:
                qvel[row] = self.init_qvel + s * rng.standard_normal(nv)
        self.physics.reset(idx, qpos, qvel)
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
        return self.physics.get_state(i)

    def set_state(self, i: int, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """Put env i in state (qpos, qvel): mj_resetData, then what Gymnasium's MujocoEnv.set_state does
        (write qpos/qvel, mj_forward). Restarts its episode step count; returns its observation."""
        idx = np.array([i])
        self.physics.reset(idx, np.asarray(qpos, np.float64)[None], np.asarray(qvel, np.float64)[None])
        self.steps[i] = 0
        return self._observe_rows(idx)[0].astype(np.float32)

    def describe_stepping(self) -> str:
        how = "mujoco.batch" if isinstance(self.physics, BatchPhysics) else "per-env MjData loop"
        return f"{how} on {self.num_threads} thread{'s' if self.num_threads > 1 else ''}"

    def close(self) -> None:
        self.physics.close()
