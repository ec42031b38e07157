"""Vectorized environments (numpy batches, torch-free). Build one with `make_env`."""
from fastsac.envs.base import StepResult, VecEnv
from fastsac.envs.registry import check_env_name, env_spec, make_env

__all__ = ["StepResult", "VecEnv", "check_env_name", "env_spec", "make_env"]
