"""The state of a run, as both trainers (synchronous and async learner) hold it: agent +
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
from fastsac.common.transition import TransitionBatch
from fastsac.config import Config, config_to_dict
from fastsac.envs.registry import EnvSpec
# CheckpointSaveError and check_run_dir_lineage: both trainers reach them through this module
from fastsac.run_dir.checkpoint import (CheckpointError, CheckpointSaveError, RunCheckpoints, check_compatible,
                                        find_resume, to_device)
from fastsac.run_dir.contents import Lineage, check_run_dir_lineage


def build_agent(cfg: Config, spec: EnvSpec, action_low: np.ndarray, action_high: np.ndarray,
                device: torch.device, num_envs: int | None = None) -> tuple[FastSAC, ReplayBuffer]:
    """num_envs: env rows of the replay buffer (default env.num_envs; a learner of a group holds
    only its own collectors' envs)."""
    agent = FastSAC(spec.obs_dim, spec.critic_obs_dim, spec.act_dim, action_low, action_high, cfg.algo, device)
    buffer = ReplayBuffer(num_envs=cfg.env.num_envs if num_envs is None else num_envs, buffer_size=cfg.algo.buffer_size, obs_dim=spec.obs_dim,
                          critic_obs_dim=spec.critic_obs_dim, act_dim=spec.act_dim,
                          n_steps=cfg.algo.num_steps, gamma=cfg.algo.gamma, device=device)
    return agent, buffer


def ingest(agent: FastSAC, buffer: ReplayBuffer, env_rows: slice, batch: TransitionBatch) -> None:
    """One env-step batch (tensors on the learner device) -> normalizer stats + replay buffer.

    Only the learner updates the normalizers; collectors use the published copy read-only.
    """
    agent.update_normalizers(batch.obs, batch.critic_obs)
    buffer.extend(env_rows, batch)


def env_meta(cfg: Config, spec: EnvSpec) -> dict:
    return {"name": cfg.env.name, "obs_dim": spec.obs_dim, "critic_obs_dim": spec.critic_obs_dim,
            "act_dim": spec.act_dim}


# The run identity (run id, save counter) lives for the process: restore() starts a run or
# continues the resumed checkpoint's run, save() continues it. Both trainers restore before they
# save; a save without a restore starts a fresh run. Keyed by run_dir, so one process (a test)
# can hold several runs.
_runs: dict[Path, RunCheckpoints] = {}


def _run_key(cfg: Config) -> Path:
    return cfg.run_path.resolve()


def lineage(cfg: Config) -> Lineage | None:
    """This process's run in cfg.run_dir (after restore): its id and the env step it resumed
    from (None: a fresh start); None without a restore (a learner of a group other than rank 0)."""
    run = _runs.get(_run_key(cfg))
    return None if run is None else Lineage(run.run_id, run.resumed_at)


def save(cfg: Config, spec: EnvSpec, agent: FastSAC, env_steps: int) -> Path:
    """Write the next checkpoint of this run; CheckpointSaveError if it could not be written
    (the previous checkpoints are kept; the caller logs it and goes on, or fails at the end)."""
    run = _runs.get(_run_key(cfg))
    if run is None:
        run = _runs[_run_key(cfg)] = RunCheckpoints.fresh(cfg.run_path, cfg.checkpoint.keep)
    run.keep = cfg.checkpoint.keep
    payload = {"agent": agent.state_dict(), "env_steps": int(env_steps), "env": env_meta(cfg, spec),
               "config": config_to_dict(cfg)}
    return run.save(payload)


# the algo keys that give the agent's state its shapes: a checkpoint fits only a job with its values
NETWORK_KEYS = ("actor_hidden_dim", "actor_num_layers", "critic_hidden_dim", "critic_num_layers", "trunk_shape",
                "num_atoms", "obs_normalization")


def check_same_networks(payload: dict, cfg: Config, path) -> None:
    """CheckpointError (exit 2) naming every network key whose value differs from the checkpoint's
    (instead of PyTorch's list of mismatched tensor shapes)."""
    theirs = (payload.get("config") or {}).get("algo") or {}
    diff = [f"algo.{key}: {theirs[key]!r} in the checkpoint, {getattr(cfg.algo, key)!r} in this job"
            for key in NETWORK_KEYS if key in theirs and theirs[key] != getattr(cfg.algo, key)]
    if diff:
        raise CheckpointError(f"checkpoint {str(path)!r} holds other networks than this job's: {'; '.join(diff)}. "
                              "Resume with the checkpoint's values, or start a fresh run in another run_dir")


def restore(cfg: Config, spec: EnvSpec, agent: FastSAC, log=print) -> int:
    """Load the checkpoint named by cfg.resume into agent; returns its env_steps (0 = fresh).

    Every checkpoint is verified (checksum, finite tensors) before it is used; with resume=auto
    a corrupt one is reported and the next newest valid one is taken. A resumed run continues
    the run id of the checkpoint it resumed from; a fresh start gets a new one."""
    found = find_resume(cfg.resume, cfg.run_path, log)
    if found is None:
        _runs[_run_key(cfg)] = RunCheckpoints.fresh(cfg.run_path, cfg.checkpoint.keep, log)
        return 0
    path, payload = found
    check_compatible(payload, cfg.env.name, spec.obs_dim, spec.critic_obs_dim, spec.act_dim, path)
    check_same_networks(payload, cfg, path)
    # verified on the CPU; every tensor to the agent's device, as torch.load's map_location would
    state = to_device(payload["agent"], str(agent.device))
    try:
        agent.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit this job's networks: {exc}") from None
    run = _runs[_run_key(cfg)] = RunCheckpoints.resumed(cfg.run_path, cfg.checkpoint.keep, path, payload, log)
    log(f"resume: loaded {path} at env step {payload['env_steps']} (continuing run {run.run_id}, "
        f"next save {run.next_seq})")
    return int(payload["env_steps"])
