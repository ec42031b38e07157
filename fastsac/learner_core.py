"""What the synchronous trainer and the async learner share: device choice, agent +
replay buffer construction, ingestion of one env-step batch, checkpoint save/restore.

Keeping these in one place is what makes checkpoints interchangeable between the two
trainers (and across collector counts).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastsac.algo.fastsac import FastSAC
from fastsac.algo.replay_buffer import ReplayBuffer
from fastsac.checkpoint import (CheckpointError, check_compatible, load_checkpoint,
                                resolve_resume, save_checkpoint)
from fastsac.config import Config, config_to_dict
from fastsac.envs.registry import EnvSpec


def build_agent(cfg: Config, spec: EnvSpec, action_low: np.ndarray, action_high: np.ndarray,
                device: torch.device) -> tuple[FastSAC, ReplayBuffer]:
    agent = FastSAC(spec.obs_dim, spec.critic_obs_dim, spec.act_dim, action_low, action_high, cfg.algo, device)
    buffer = ReplayBuffer(num_envs=cfg.env.num_envs, buffer_size=cfg.algo.buffer_size, obs_dim=spec.obs_dim,
                          critic_obs_dim=spec.critic_obs_dim, act_dim=spec.act_dim,
                          n_steps=cfg.algo.num_steps, gamma=cfg.algo.gamma, device=device)
    return agent, buffer


def ingest(agent: FastSAC, buffer: ReplayBuffer, env_rows: slice, obs, critic_obs, actions, rewards,
           terminated, truncated, final_idx, final_obs, final_critic_obs) -> None:
    """One env-step batch (tensors on the learner device) -> normalizer stats + replay buffer.

    Only the learner updates the normalizers; collectors use the published copy read-only.
    """
    agent.update_normalizers(obs, critic_obs)
    buffer.extend(env_rows, obs, critic_obs, actions, rewards, terminated, truncated,
                  final_idx, final_obs, final_critic_obs)


def env_meta(cfg: Config, spec: EnvSpec) -> dict:
    return {"name": cfg.env.name, "obs_dim": spec.obs_dim, "critic_obs_dim": spec.critic_obs_dim,
            "act_dim": spec.act_dim}


def save(cfg: Config, spec: EnvSpec, agent: FastSAC, env_steps: int) -> Path:
    payload = {"agent": agent.state_dict(), "env_steps": int(env_steps), "env": env_meta(cfg, spec),
               "config": config_to_dict(cfg)}
    return save_checkpoint(cfg.run_path, payload, cfg.checkpoint.keep)


def restore(cfg: Config, spec: EnvSpec, agent: FastSAC, log=print) -> int:
    """Load the checkpoint named by cfg.resume into agent; returns its env_steps (0 = fresh)."""
    path = resolve_resume(cfg.resume, cfg.run_path, log)
    if path is None:
        return 0
    payload = load_checkpoint(path, map_location=str(agent.device))
    check_compatible(payload, cfg.env.name, spec.obs_dim, spec.critic_obs_dim, spec.act_dim, path)
    try:
        agent.load_state_dict(payload["agent"])
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this job's networks: {exc}") from None
    log(f"resume: loaded {path} at env step {payload['env_steps']}")
    return int(payload["env_steps"])
