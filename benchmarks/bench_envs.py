r"""Env throughput: fastsac's batched MuJoCo tasks vs Gymnasium's Python-loop vector env.

For each task and number of envs, builds Gymnasium's SyncVectorEnv (same-step autoreset)
and fastsac's batched env with each thread count, then measures them in --rounds rounds: in a
round the cells take one batched step each in turn until each has run --seconds (uniform random
actions; episodes end and auto-reset as in training: random Humanoid/Ant fall within ~20-60
steps). It reports the median round of each cell (env-steps/s; per core = / physics threads,
Gymnasium uses one; per second of process CPU time) and, against Gymnasium, the median and
range of the ratios taken round by round. On a shared VM the speed of the whole machine drifts
by tens of percent within seconds: cells stepped alternately see the same drift, so their ratio
cancels it, where ratios of separately measured best rounds do not. Absolute numbers still
vary between runs.

The "physics bound" row counts only the time spent in the MuJoCo calls Gymnasium's env makes
(mj_step with frame_skip, mj_rnePostConstraint) and the field copies: its "vs gym" ratio is the
largest per-core speed-up over Gymnasium any implementation with Gymnasium's physics can reach.

    .venv/bin/python benchmarks/bench_envs.py                      # 3 tasks x 256, 1024 envs x 1, 2 threads
    .venv/bin/python benchmarks/bench_envs.py --tasks humanoid --num-envs 256 --threads 1 2 --seconds 3
    .venv/bin/python benchmarks/bench_envs.py --tasks halfcheetah --with-loop   # mujoco.batch vs the per-env loop
    .venv/bin/python benchmarks/bench_envs.py --tasks --envpool-tasks HumanoidRun-v1 \
        BerkeleyHumanoidJoystickFlatTerrain-v1 --num-envs 64 --threads 1 2        # EnvPool: raw vs the adapter

Needs the optional extra (pip install 'fastsac[mujoco]') and imageio for Gymnasium's
MuJoCo envs (pip install 'gymnasium[mujoco]').

EnvPool rows (--envpool-tasks, optional extra fastsac[envpool]): per task, size and thread
count, EnvPool's own pool stepped directly (`pool.step`, its next-step auto-reset: the step
after an episode ends only resets that env) against the same pool behind fastsac's
`envpool:` adapter (same-step reset of the ended envs, float32 obs/critic_obs split), both
with the same threads and thread placement, paired round by round: "vs raw" is the
adapter's speed as a fraction of EnvPool's (1 - it = the adapter's overhead).
--envpool-affinity adds a raw cell with the workers pinned one per CPU (EnvPool's
thread_affinity_offset; possible where the threads = this process's CPUs, consecutive ids) to
compare with the adapter's placement, the process's CPUs (run it under numactl).
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

from fastsac.envs.mujoco_physics import mujoco_batch_module  # noqa: E402
from fastsac.envs.registry import ENVPOOL_PREFIX, env_class, make_env  # noqa: E402

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
    """One implementation at one size, built once and measured in interleaved rounds.

    A round steps every cell in turn, one batched step each, until --seconds per cell have
    passed, so all cells of a round see the same machine speed; each cell adds up its own
    time (wall and process CPU) and steps, and records one rate per round.
    """

    def __init__(self, label, threads, env, step, low, high, num_envs):
        self.label, self.threads, self.env, self.step, self.num_envs = label, threads, env, step, num_envs
        rng = np.random.default_rng(0)
        self.acts = [rng.uniform(low, high, (num_envs, low.size)).astype(np.float32) for _ in range(8)]
        self.k = 0
        self.wall_rates, self.cpu_rates = [], []
        self.wall = self.cpu = 0.0
        self.n = 0

    def _next_step(self):
        self.step(self.acts[self.k % 8])
        self.k += 1

    def warm_up(self, steps):
        for _ in range(steps):
            self._next_step()

    def begin_round(self):
        self.wall = self.cpu = 0.0
        self.n = 0

    def step_timed(self):
        w, c = time.perf_counter(), time.process_time()
        self._next_step()
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        self.n += 1

    def end_round(self):
        self.wall_rates.append(self.n * self.num_envs / self.wall)
        self.cpu_rates.append(self.n * self.num_envs / max(self.cpu, 1e-9))

    def close(self):
        self.env.close()


def measure_rounds(cells, args) -> None:
    """args.rounds paired rounds over the cells, then close them (also on an error)."""
    try:
        for _ in range(args.rounds):
            measure_round(cells, args.warmup, args.seconds)
    finally:
        for cell in cells:
            cell.close()


def measure_round(cells, warmup, seconds):
    """One round: every cell steps in turn until each has run `seconds` (the slowest sets the pace)."""
    for cell in cells:
        cell.warm_up(warmup)
        cell.begin_round()
    while min(cell.wall for cell in cells) < seconds:
        for cell in cells:
            cell.step_timed()
    for cell in cells:
        cell.end_round()


def batched_cell(task, num_envs, threads, physics="auto"):
    """fastsac's env; physics="loop" forces the per-env MjData loop where mujoco.batch would step it."""
    env = env_class(task)(num_envs, seed=0, num_threads=threads, physics=physics)
    label = "fastsac loop" if physics == "loop" else "fastsac batched"
    return _Cell(label, threads, env, env.step, env.action_low, env.action_high, num_envs)


def uses_mujoco_batch(task) -> bool:
    return env_class(task).state_only and mujoco_batch_module() is not None


class _PhysicsBoundCell(_Cell):
    """The ceiling for any implementation of the task: the time spent in Gymnasium's MuJoCo calls alone.

    Steps a 1-thread batched env as usual (so episodes fall and reset as in the other cells) but
    counts only the time inside its physics step: per env `ctrl[:] = a`, `mj_step(m, d, frame_skip)`,
    `mj_rnePostConstraint` (the calls Gymnasium's MujocoEnv makes) and the copy of the fields the
    task reads. No implementation that makes those calls can be faster per core than this row, so
    its "vs gym" column is the largest speed-up over Gymnasium this task allows on this machine.
    """

    def __init__(self, task, num_envs):
        env = make_env(task, num_envs, seed=0, num_threads=1)
        super().__init__("physics bound", 1, env, env.step, env.action_low, env.action_high, num_envs)
        physics_step = env._physics_step

        def timed_physics_step():
            w, c = time.perf_counter(), time.process_time()
            physics_step()
            self.wall += time.perf_counter() - w
            self.cpu += time.process_time() - c

        env._physics_step = timed_physics_step

    def step_timed(self):
        self._next_step()  # the physics step inside it adds its own time
        self.n += 1


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


def envpool_cells(task_id, num_envs, threads, with_affinity):
    """EnvPool stepped directly, then through fastsac's adapter (same seeds, threads, thread placement);
    with_affinity: also the raw pool with its workers pinned one per CPU, where this process's CPUs allow it."""
    import envpool

    from fastsac.common.seeds import envpool_env_seeds
    from fastsac.envs.envpool_adapter import thread_affinity_offset
    adapter = make_env(ENVPOOL_PREFIX + task_id, num_envs, seed=0, num_threads=threads)
    adapter.reset(0)
    placements = [("envpool raw", thread_affinity_offset(adapter.num_threads))]   # the adapter's default
    if with_affinity:
        try:
            placements.append(("envpool raw pin", thread_affinity_offset(adapter.num_threads, "pin")))
        except ValueError:  # e.g. fewer threads than CPUs: EnvPool cannot pin inside them
            pass
    cells = []
    for label, offset in placements:
        pool = envpool.make_gymnasium(task_id, num_envs=num_envs, batch_size=num_envs, num_threads=adapter.num_threads,
                                      thread_affinity_offset=offset, seed=envpool_env_seeds(0, 0, num_envs).tolist(),
                                      max_episode_steps=adapter.max_episode_steps)
        pool.reset()
        cells.append(_Cell(label, adapter.num_threads, pool, pool.step, adapter.action_low, adapter.action_high,
                           num_envs))
    cells.insert(1, _Cell("fastsac envpool", adapter.num_threads, adapter, adapter.step, adapter.action_low,
                          adapter.action_high, num_envs))
    return cells


def _print_rows(task, n, cells, base, width):
    for cell in cells:
        wall, cpu = float(np.median(cell.wall_rates)), float(np.median(cell.cpu_rates))
        per_core = wall / cell.threads
        if base is not None:
            r_core = _paired_ratio(np.array(cell.wall_rates) / cell.threads, np.array(base.wall_rates) / base.threads)
            r_cpu = _paired_ratio(cell.cpu_rates, base.cpu_rates)
        else:
            r_core = r_cpu = "-"
        print(f"{task:<{width}} {n:>5} {cell.label:<16} {cell.threads:>3} {wall:>12,.0f} {per_core:>10,.0f} "
              f"{cpu:>10,.0f} {r_core:>22} {r_cpu:>22}", flush=True)


def _print_header(width, base_name):
    header = (f"{'task':<{width}} {'envs':>5} {'impl':<16} {'thr':>3} {'env-steps/s':>12} {'per core':>10} "
              f"{'per CPU-s':>10} {'vs ' + base_name + '/core':>22} {'vs ' + base_name + '/CPU-s':>22}")
    print(header)
    print("-" * len(header))


def _envpool_table(args):
    import envpool

    width = max(12, *(len(t) for t in args.envpool_tasks))
    print(f"\n# EnvPool {envpool.__version__}: envpool raw = pool.step (next-step auto-reset), fastsac envpool = "
          "the envpool: adapter on the same pool config; vs raw = round-by-round ratio to envpool raw, same threads")
    _print_header(width, "raw")
    for task in args.envpool_tasks:
        for n in args.num_envs:
            for t in args.threads:
                cells = envpool_cells(task, n, t, args.envpool_affinity)
                measure_rounds(cells, args)
                _print_rows(task, n, cells, cells[0], width)


def _paired_ratio(rates, base_rates) -> str:
    """'median [min-max]' of the round-by-round ratios rates[i] / base_rates[i]."""
    r = np.asarray(rates, float) / np.asarray(base_rates, float)
    return f"{np.median(r):.2f}x [{r.min():.2f}-{r.max():.2f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="*", default=list(GYM_IDS), choices=list(GYM_IDS),
                   help="built-in tasks vs Gymnasium (none: only the EnvPool rows)")
    p.add_argument("--envpool-tasks", nargs="*", default=[], metavar="TASK_ID",
                   help="EnvPool task ids: raw EnvPool vs the fastsac adapter (needs fastsac[envpool])")
    p.add_argument("--envpool-affinity", action="store_true",
                   help="EnvPool rows: also the raw pool with its threads pinned one per CPU, where possible")
    p.add_argument("--num-envs", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--seconds", type=float, default=1.0, help="measured time per cell and round")
    p.add_argument("--rounds", type=int, default=7,
                   help="interleaved rounds per cell; medians and round-by-round ratios are reported")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps per cell and round")
    p.add_argument("--no-gymnasium", action="store_true", help="skip the Gymnasium baseline")
    p.add_argument("--with-loop", action="store_true",
                   help="tasks stepped by mujoco.batch (HalfCheetah): also measure the per-env MjData loop")
    p.add_argument("--no-bound", action="store_true",
                   help="skip the physics-bound row (time in Gymnasium's MuJoCo calls alone: the ceiling)")
    args = p.parse_args(argv)

    try:
        import mujoco
        mujoco_version = mujoco.__version__
    except ImportError:
        if args.tasks:
            raise
        mujoco_version = "missing"
    try:
        import gymnasium
        gym_version = gymnasium.__version__
    except ImportError:
        gym_version = "missing"
    print(f"# machine: {platform.machine()}, nproc {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}), "
          f"CPU: {_cpu_model()}, load average at start {os.getloadavg()[0]:.2f}")
    print(f"# python {platform.python_version()}, numpy {np.__version__}, mujoco {mujoco_version}, "
          f"gymnasium {gym_version}")
    print(f"# {args.rounds} rounds of {args.seconds:g} s per cell, cells stepped alternately (after {args.warmup} "
          "warm-up steps each); uniform random actions, auto-reset on termination/truncation")
    print("# env-steps/s, per core (= / physics threads; Gymnasium: 1), per CPU-s (env-steps per second of "
          "process CPU time): median round")
    if args.tasks:
        print("# vs gym: median [min-max] over rounds of (this cell / Gymnasium in the same round), per core and "
              "per CPU-s")
        print("# physics bound = the same batched env timed inside its physics step only: the ceiling for "
              "Gymnasium's physics")
        print()
        _print_header(12, "gym")
    old_cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # any MUJOCO_LOG.TXT lands here, not in the repo
        try:
            for task in args.tasks:
                for n in args.num_envs:
                    cells = [] if args.no_gymnasium else [gymnasium_cell(task, n)]
                    cells += [] if args.no_bound else [_PhysicsBoundCell(task, n)]
                    cells += [batched_cell(task, n, t) for t in args.threads]
                    if args.with_loop and uses_mujoco_batch(task):
                        cells += [batched_cell(task, n, t, physics="loop") for t in args.threads]
                    measure_rounds(cells, args)
                    _print_rows(task, n, cells, None if args.no_gymnasium else cells[0], 12)
            if args.envpool_tasks:
                _envpool_table(args)
        finally:
            os.chdir(old_cwd)
    print(f"\n# load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
