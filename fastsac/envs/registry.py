"""Env names -> constructors. Torch-free.

Built-in tasks are registered in BUILTIN_ENVS (module path + class name, imported on
demand so optional dependencies such as mujoco are only needed when used).
`gymnasium:<id>` wraps any Gymnasium env id, `envpool:<task id>` any EnvPool task (optional extra
fastsac[envpool]); `package.module:ClassName` builds your own VecEnv subclass (same constructor
arguments as the built-ins), importable in every process.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from fastsac.errors import ConfigError

# name -> (module, class). Every class takes (num_envs, seed, first_env_id, max_episode_steps, num_threads).
BUILTIN_ENVS: dict[str, tuple[str, str]] = {
    "pendulum": ("fastsac.envs.pendulum", "PendulumSwingUp"),
    # Gymnasium v5 locomotion tasks, batched MuJoCo (optional extra: pip install 'fastsac[mujoco]')
    "humanoid": ("fastsac.envs.mujoco_tasks", "Humanoid"),
    "ant": ("fastsac.envs.mujoco_tasks", "Ant"),
    "halfcheetah": ("fastsac.envs.mujoco_tasks", "HalfCheetah"),
}
GYMNASIUM_PREFIX = "gymnasium:"
ENVPOOL_PREFIX = "envpool:"
# prefix -> (module, class, the keyword argument that gets the id after the prefix)
ADAPTERS: dict[str, tuple[str, str, str]] = {
    GYMNASIUM_PREFIX: ("fastsac.envs.gymnasium_adapter", "GymnasiumVecEnv", "env_id"),
    ENVPOOL_PREFIX: ("fastsac.envs.envpool_adapter", "EnvPoolVecEnv", "task_id"),
}


@dataclass(frozen=True)
class EnvSpec:
    obs_dim: int
    critic_obs_dim: int
    act_dim: int
    max_episode_steps: int


def _adapter_prefix(name: str) -> str | None:
    return next((p for p in ADAPTERS if name.startswith(p)), None)


def _is_custom(name: str) -> bool:
    return ":" in name and _adapter_prefix(name) is None


def check_env_name(name: str) -> None:
    """Raise ConfigError for a name that is neither built in, gymnasium:<id>, nor module:Class."""
    if _is_custom(name):
        module, _, cls = name.partition(":")
        if not module or not cls.isidentifier():
            raise ConfigError(f"env.name: {name!r} is not a valid custom env; expected package.module:ClassName")
        return
    if name.startswith(GYMNASIUM_PREFIX):
        if not name[len(GYMNASIUM_PREFIX):]:
            raise ConfigError(f"env.name: {name!r} names no Gymnasium id; expected gymnasium:<id>, e.g. gymnasium:Pendulum-v1")
        return
    if name.startswith(ENVPOOL_PREFIX):
        if not name[len(ENVPOOL_PREFIX):]:
            raise ConfigError(f"env.name: {name!r} names no EnvPool task; expected envpool:<task id>, "
                              "e.g. envpool:HumanoidRun-v1")
        return
    if name not in BUILTIN_ENVS:
        close = difflib.get_close_matches(name, list(BUILTIN_ENVS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"env.name: {name!r} is not a known env{hint} "
                          f"(built in: {', '.join(sorted(BUILTIN_ENVS))}; or gymnasium:<id>; or envpool:<task id>; "
                          "or package.module:ClassName for your own VecEnv)")


def env_class(name: str):
    """The VecEnv class behind an env.name (imported on demand)."""
    check_env_name(name)
    prefix = _adapter_prefix(name)
    if prefix is not None:
        module, cls, _ = ADAPTERS[prefix]
        return getattr(importlib.import_module(module), cls)
    module, cls = name.partition(":")[::2] if _is_custom(name) else BUILTIN_ENVS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:
        if not _is_custom(name):
            raise
        raise ConfigError(f"env.name: cannot import {name!r}: {exc}") from None


def make_env(name: str, num_envs: int, seed: int, first_env_id: int = 0,
             max_episode_steps: int = 0, num_threads: int = 1):
    """Build a VecEnv for the global env ids [first_env_id, first_env_id + num_envs)."""
    cls = env_class(name)
    kwargs = dict(num_envs=num_envs, seed=seed, first_env_id=first_env_id,
                  max_episode_steps=max_episode_steps, num_threads=num_threads)
    prefix = _adapter_prefix(name)
    if prefix is not None:
        kwargs[ADAPTERS[prefix][2]] = name[len(prefix):]
    return cls(**kwargs)


def env_spec(name: str, max_episode_steps: int = 0) -> EnvSpec:
    """Dimensions of a task, read off a one-env instance."""
    env = make_env(name, 1, seed=0, max_episode_steps=max_episode_steps)
    try:
        return EnvSpec(env.obs_dim, env.critic_obs_dim, env.act_dim, env.max_episode_steps)
    finally:
        env.close()
