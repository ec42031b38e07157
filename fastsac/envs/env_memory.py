"""What one env of a task costs in memory, for the launcher's memory check (fastsac.launch.preflight).

Built-in tasks: a table (KNOWN_BYTES_PER_ENV), measured with `measure_bytes_per_env` and
checked against a fresh measurement by tests/process/launch/test_env_memory_process.py. Every other task (gymnasium:,
envpool:, module:Class) is measured at start-up in a child process (`python -m
fastsac.envs.env_memory`): it builds one env, then 1 + PROBE_ENVS more, resets and steps them a few
times (EnvPool allocates per env as its envs first run), and reports the resident-memory growth per
env. The child goes away with what it allocated; the launcher never holds those envs.

Each process of a job also carries its interpreter, numpy, torch and the env libraries:
PROCESS_BASE_BYTES (measured: ~240 MB resident after `import torch, mujoco` on Linux x86-64).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np

from fastsac.envs.registry import BUILTIN_ENVS, make_env

MIB = 2**20
# resident bytes per env after reset + a few steps (measured on 512 envs, x1.25 for headroom):
# pendulum 2.4 KiB, halfcheetah 6.0 KiB (mujoco.batch: no MjData per env), ant 482 KiB, humanoid 495 KiB
KNOWN_BYTES_PER_ENV = {"pendulum": 3 * 2**10, "halfcheetah": 8 * 2**10, "ant": 600 * 2**10,
                       "humanoid": 620 * 2**10}
PROCESS_BASE_BYTES = 300 * MIB
PROBE_ENVS = 4
PROBE_STEPS = 3
PROBE_TIMEOUT_S = 180.0


def _rss() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


def _exercise(env) -> None:
    env.reset(0)
    actions = np.zeros((env.num_envs, env.act_dim), np.float32)
    for _ in range(PROBE_STEPS):
        env.step(actions)


def measure_bytes_per_env(name: str, max_episode_steps: int = 0, num_envs: int = PROBE_ENVS) -> int:
    """Resident-memory growth per env of `num_envs` more envs, in this process (a library's
    one-time cost is paid by the first, one-env instance and not counted)."""
    first = make_env(name, 1, seed=0, max_episode_steps=max_episode_steps)
    try:
        _exercise(first)
        before = _rss()
        more = make_env(name, num_envs, seed=1, max_episode_steps=max_episode_steps)
        try:
            _exercise(more)
            return max(0, _rss() - before) // num_envs
        finally:
            more.close()
    finally:
        first.close()


def bytes_per_env(name: str, max_episode_steps: int = 0) -> tuple[int | None, str]:
    """(bytes per env, where the number comes from); None when a probe could not measure it."""
    if name in BUILTIN_ENVS:
        return KNOWN_BYTES_PER_ENV[name], "fastsac's table for the built-in task"
    cmd = [sys.executable, "-m", "fastsac.envs.env_memory", name, str(max_episode_steps)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None, f"the probe did not finish within {PROBE_TIMEOUT_S:g} s"
    try:
        return int(json.loads(proc.stdout.strip().splitlines()[-1])["bytes_per_env"]), \
            f"measured on {PROBE_ENVS} envs in a probe process"
    except (ValueError, KeyError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the probe failed (exit {proc.returncode}: {tail})"


if __name__ == "__main__":   # python -m fastsac.envs.env_memory TASK [MAX_EPISODE_STEPS [NUM_ENVS]]
    task = sys.argv[1]
    steps, envs = (int(sys.argv[2]) if len(sys.argv) > 2 else 0), (int(sys.argv[3]) if len(sys.argv) > 3 else PROBE_ENVS)
    print(json.dumps({"bytes_per_env": measure_bytes_per_env(task, steps, envs)}))
