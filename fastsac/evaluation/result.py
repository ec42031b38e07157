"""The result record of one evaluation (the eval channel's fields,
fastsac.shm_layout.eval_channel), its TensorBoard scalars and its console line: every trainer
logs an evaluation the same way. Torch-free.
"""
from __future__ import annotations

import time

import numpy as np

SCALARS = ("mean_return", "mean_ep_len", "min_return", "max_return", "min_ep_len", "max_ep_len", "seconds")


def summarize(returns: np.ndarray, lengths: np.ndarray, env_steps: int, weight_version: int,
              seconds: float) -> dict:
    """The result record (the eval channel's fields, fastsac.shm_layout.eval_channel)."""
    return {"env_steps": int(env_steps), "weight_version": int(weight_version), "episodes": len(returns),
            "mean_return": float(np.mean(returns)), "min_return": float(np.min(returns)),
            "max_return": float(np.max(returns)), "mean_ep_len": float(np.mean(lengths)),
            "min_ep_len": int(np.min(lengths)), "max_ep_len": int(np.max(lengths)), "seconds": float(seconds),
            "finished_ns": time.monotonic_ns()}


def scalars(result: dict) -> dict[str, float]:
    """eval/* TensorBoard scalars of a result (logged at result['env_steps'])."""
    return {f"eval/{k}": float(result[k]) for k in SCALARS}


def line(result: dict) -> str:
    """The console line of a result."""
    return (f"eval @ {result['env_steps']:,} env steps (weights v{result['weight_version']}): return mean "
            f"{result['mean_return']:.1f} min {result['min_return']:.1f} max {result['max_return']:.1f} | "
            f"length mean {result['mean_ep_len']:.1f} min {result['min_ep_len']} max {result['max_ep_len']} | "
            f"{result['episodes']} episodes in {result['seconds']:.2f}s")
