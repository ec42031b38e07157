"""Helpers for end-to-end tests that run the real CLI in subprocesses."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

SHM_DIR = "/dev/shm"


def tiny_config(tmp_path: Path, job: str, **sections) -> Path:
    """A pendulum job small enough to train a few iterations in seconds on one CPU."""
    cfg = {
        "job_name": job,
        "run_dir": str(tmp_path / "run"),
        "seed": 1,
        "device": "cpu",
        "env": {"name": "pendulum", "num_envs": 8},
        "algo": {"actor_hidden_dim": 32, "critic_hidden_dim": 32, "actor_num_layers": 2, "critic_num_layers": 2,
                 "num_atoms": 21, "v_min": -300.0, "v_max": 10.0, "batch_size": 64, "num_updates": 1,
                 "learning_starts": 2, "buffer_size": 64},
        "trainer": {"num_iterations": 12, "asynchronous": True,
                    "async_options": {"ring_capacity": 4, "max_ingest_per_iter": 4, "weight_publish_interval": 2,
                                      "weight_poll_interval": 2, "collector_inference_device": "cpu"}},
        "logging": {"interval": 4, "interval_s": 1.0},
        "checkpoint": {"interval": 6, "keep": 5},
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, dict):
                    cfg[key].setdefault(k, {}).update(v)
                else:
                    cfg[key][k] = v
        else:
            cfg[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(config: Path, *overrides: str, timeout: float = 240, env: dict | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run fastsac-launch to completion; on timeout kill its whole process group and fail."""
    proc = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(config), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"fastsac-launch timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def job_segments(job: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"fastsac.{job}."))


def scalar_tags(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def newest_checkpoint(run_dir: Path) -> Path:
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts, f"no checkpoint in {run_dir / 'checkpoints'}"
    return ckpts[-1]


def free_port() -> int:
    """A TCP port nobody listens on right now (a learner group's rendezvous in a test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str):
    """predicate()'s first truthy value, polled every 50 ms; AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def observe(job: str):
    """A read-only handle on a running job's control block, or None while there is none."""
    from fastsac import shm_layout as shm
    try:
        return shm.ControlBlock.attach(job, role="observer")
    except shm.ShmLayoutError:
        return None


def kill_all(launcher: subprocess.Popen | None, *others: subprocess.Popen) -> None:
    """Test clean-up: SIGKILL the launcher's whole process group and any process started by hand."""
    for proc in [p for p in (launcher, *others) if p is not None]:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL) if proc is launcher else proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()
