"""Env throughput: fastsac's batched MuJoCo tasks vs Gymnasium's Python-loop vector env.

For each task and number of envs, builds Gymnasium's SyncVectorEnv (same-step autoreset)
and fastsac's batched env with each thread count, then measures them in interleaved
rounds (--rounds x --seconds each, stepping with uniform random actions; episodes end and
auto-reset as in training: random Humanoid/Ant fall within ~20-60 steps) and reports the
best round of each: env-steps/s, per core (= / physics threads; Gymnasium uses one) and per
second of process CPU time. Interleaving and best-of make the ratios robust to other load
on a shared machine; absolute numbers still vary between runs.

    .venv/bin/python benchmarks/bench_envs.py                      # 3 tasks x 256, 1024 envs x 1, 2 threads
    .venv/bin/python benchmarks/bench_envs.py --tasks humanoid --num-envs 256 --threads 1 2 --seconds 3

Needs the optional extra (pip install 'fastsac[mujoco]') and imageio for Gymnasium's
MuJoCo envs (pip install 'gymnasium[mujoco]').
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fastsac.envs.registry import make_env  # noqa: E402

GYM_IDS = {"humanoid": "Humanoid-v5", "ant": "Ant-v5", "halfcheetah": "HalfCheetah-v5"}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class _Cell:
    """One implementation at one size, built once and measured in several interleaved rounds."""

    def __init__(self, label, threads, env, step, low, high, num_envs):
        self.label, self.threads, self.env, self.step, self.num_envs = label, threads, env, step, num_envs
        rng = np.random.default_rng(0)
        self.acts = [rng.uniform(low, high, (num_envs, low.size)).astype(np.float32) for _ in range(8)]
        self.k = 0
        self.wall_rates, self.cpu_rates = [], []

    def measure(self, warmup, seconds):
        for _ in range(warmup):
            self.step(self.acts[self.k % 8])
            self.k += 1
        n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while True:
            self.step(self.acts[self.k % 8])
            self.k += 1
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
        cpu = time.process_time() - cpu0
        self.wall_rates.append(n * self.num_envs / elapsed)
        self.cpu_rates.append(n * self.num_envs / cpu)

    def close(self):
        self.env.close()


def batched_cell(task, num_envs, threads):
    env = make_env(task, num_envs, seed=0, num_threads=threads)
    return _Cell("fastsac batched", threads, env, env.step, env.action_low, env.action_high, num_envs)


@contextlib.contextmanager
def _quiet_mujoco():
    """Gymnasium's HalfCheetah XML makes MuJoCo 4 print a deprecation line (and append it
    to MUJOCO_LOG.TXT in the cwd) per env: build the envs with those warnings dropped."""
    try:
        import mujoco
        from fastsac.envs.mujoco_base import quiet_mujoco_compile
    except ImportError:
        yield
        return
    with quiet_mujoco_compile(mujoco):
        yield


def gymnasium_cell(task, num_envs):
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    gid = GYM_IDS[task]
    with _quiet_mujoco():
        env = SyncVectorEnv([lambda: gym.make(gid) for _ in range(num_envs)],
                            autoreset_mode=AutoresetMode.SAME_STEP)
    env.reset(seed=list(range(num_envs)))
    space = env.single_action_space
    return _Cell("gymnasium sync", 1, env, env.step, space.low, space.high, num_envs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(GYM_IDS), choices=list(GYM_IDS))
    p.add_argument("--num-envs", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--seconds", type=float, default=2.0, help="measured time per cell and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell; the best is reported")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps per cell and round")
    p.add_argument("--no-gymnasium", action="store_true", help="skip the Gymnasium baseline")
    args = p.parse_args(argv)

    import mujoco
    try:
        import gymnasium
        gym_version = gymnasium.__version__
    except ImportError:
        gym_version = "missing"
    print(f"# machine: {platform.machine()}, nproc {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}), "
          f"CPU: {_cpu_model()}, load average at start {os.getloadavg()[0]:.2f}")
    print(f"# python {platform.python_version()}, numpy {np.__version__}, mujoco {mujoco.__version__}, "
          f"gymnasium {gym_version}")
    print(f"# {args.rounds} interleaved rounds of {args.seconds:g} s per cell (after {args.warmup} warm-up steps "
          "each), best round reported; uniform random actions, auto-reset on termination/truncation")
    print("# per core = env-steps/s / physics threads (Gymnasium: 1); per CPU-s = env-steps per second of "
          "process CPU time (robust to other load)")
    print()
    header = (f"{'task':<12} {'envs':>5} {'impl':<16} {'thr':>3} {'env-steps/s':>12} {'per core':>10} "
              f"{'per CPU-s':>10} {'vs gym/core':>11} {'vs gym/CPU-s':>12}")
    print(header)
    print("-" * len(header))
    old_cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # any MUJOCO_LOG.TXT lands here, not in the repo
        try:
            for task in args.tasks:
                for n in args.num_envs:
                    cells = [] if args.no_gymnasium else [gymnasium_cell(task, n)]
                    cells += [batched_cell(task, n, t) for t in args.threads]
                    try:
                        for _ in range(args.rounds):
                            for cell in cells:
                                cell.measure(args.warmup, args.seconds)
                    finally:
                        for cell in cells:
                            cell.close()
                    base = None if args.no_gymnasium else cells[0]
                    for cell in cells:
                        wall, cpu = max(cell.wall_rates), max(cell.cpu_rates)
                        per_core = wall / cell.threads
                        if base is not None:
                            r_core = f"{per_core / max(base.wall_rates):.2f}x"
                            r_cpu = f"{cpu / max(base.cpu_rates):.2f}x"
                        else:
                            r_core = r_cpu = "-"
                        print(f"{task:<12} {n:>5} {cell.label:<16} {cell.threads:>3} {wall:>12,.0f} {per_core:>10,.0f} "
                              f"{cpu:>10,.0f} {r_core:>11} {r_cpu:>12}", flush=True)
        finally:
            os.chdir(old_cwd)
    print(f"\n# load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
