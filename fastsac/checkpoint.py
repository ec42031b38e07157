"""Checkpoints: one `.pt` file per save, written atomically, carrying no topology.

Contents (a plain dict, loadable with torch.load(weights_only=True)):
  format, format_version, agent (FastSAC.state_dict: networks, targets, both
  normalizers, log_alpha, optimizers, update counter), env_steps (transitions
  collected so far, all collectors together), env (name + dims), config (the job's
  config as a dict), saved_at (unix time).

The synchronous trainer and the async learner write and read the same format, so
either resumes the other, from any collector count. Replay buffer and ring contents
are not saved: a resumed run refills its buffer.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from fastsac.shm_layout import pid_alive

FORMAT = "fastsac-checkpoint"
FORMAT_VERSION = 1
CKPT_GLOB = "ckpt_*.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, truncated or incompatible)."""


def checkpoint_dir(run_path: Path) -> Path:
    return Path(run_path) / "checkpoints"


def checkpoint_name(env_steps: int) -> str:
    return f"ckpt_{env_steps:014d}.pt"


def save_checkpoint(run_path: Path, payload: dict, keep: int) -> Path:
    """Write payload atomically (temp file + fsync + rename + dir fsync) and prune to `keep` files.

    A crash at any point leaves either the previous set of checkpoints or the new file
    complete, never a half-written `ckpt_*.pt`.
    """
    import torch

    directory = checkpoint_dir(run_path)
    directory.mkdir(parents=True, exist_ok=True)
    # A process killed mid-save leaves its temp file (named after its pid) behind: remove those
    # of dead writers, never one that a live process may still be writing.
    for leftover in directory.glob(".tmp_ckpt_*"):
        pid = leftover.name.split("_")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            leftover.unlink(missing_ok=True)
    payload = dict(payload, format=FORMAT, format_version=FORMAT_VERSION, saved_at=time.time())
    final = directory / checkpoint_name(int(payload["env_steps"]))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp_ckpt_{os.getpid()}_", suffix=".pt", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in sorted(directory.glob(CKPT_GLOB))[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> dict:
    import torch

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    try:
        payload = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated zip, random bytes, pickle errors: all mean "unusable"
        raise CheckpointError(f"checkpoint {str(p)!r} is corrupt or truncated ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(p)!r} is not a fastsac checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(p)!r} has format version {payload.get('format_version')}; "
                              f"this fastsac reads version {FORMAT_VERSION}")
    for key in ("agent", "env_steps", "env"):
        if key not in payload:
            raise CheckpointError(f"checkpoint {str(p)!r} lacks the field {key!r}")
    return payload


def newest_valid_checkpoint(run_path: Path, log=print) -> Path | None:
    """The newest checkpoint in run_path that loads; corrupt ones are reported and skipped."""
    for candidate in sorted(checkpoint_dir(run_path).glob(CKPT_GLOB), reverse=True):
        try:
            load_checkpoint(candidate)
            return candidate
        except CheckpointError as exc:
            log(f"resume: skipping {exc}")
    return None


def resolve_resume(resume: str, run_path: Path, log=print) -> Path | None:
    """Map the `resume` config value to a checkpoint path (None = fresh start)."""
    if not resume:
        return None
    if resume == "auto":
        path = newest_valid_checkpoint(run_path, log)
        log(f"resume: {'from ' + str(path) if path else 'no valid checkpoint in ' + str(checkpoint_dir(run_path)) + ', starting fresh'}")
        return path
    return Path(resume)


def check_compatible(payload: dict, env_name: str, obs_dim: int, critic_obs_dim: int, act_dim: int, path) -> None:
    env = payload["env"]
    mine = {"name": env_name, "obs_dim": obs_dim, "critic_obs_dim": critic_obs_dim, "act_dim": act_dim}
    for key, value in mine.items():
        if env.get(key) != value:
            raise CheckpointError(f"checkpoint {str(path)!r} was trained with env {key}={env.get(key)!r}, "
                                  f"but this job has {key}={value!r}")
