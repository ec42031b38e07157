"""Learning benchmark: deterministic eval return against env steps and wall-clock, fastsac's
trainers and a peer (Stable-Baselines3 SAC) in one run, on the same machine and budget.

Each run is the real thing: `fastsac-launch CONFIG ...` for a fastsac mode, benchmarks/sb3_peer.py
for SB3, one run at a time, seeds outer and modes inner, so the order interleaves and slow phases
of a shared machine hit every mode alike. Each run gets the same training wall-clock budget (--budget-s;
the sync trainer's inline evaluation is added to it, as the peer's evaluation is off its clock)
and is stopped by SIGTERM when it is spent (a fastsac run then writes its final checkpoint).

What is measured is the deterministic evaluation: eval/mean_return of fastsac's evaluation
(eval.* of the config; separate envs, never a training seed), the same number of deterministic
episodes for SB3 on separate envs. The training clock excludes evaluation time where evaluation
blocks training (the sync trainer's inline evaluation, SB3's); the async trainer evaluates in a
process of its own, which costs it CPU but not time. Every run also ends with a final evaluation
of the policy it holds when its budget is spent (fastsac-eval on the final checkpoint, SB3's
model in its own process; --final-episodes episodes, off the clock): the return a user stopping
at the budget gets, not the last periodic evaluation up to an eval interval earlier.

Reported, per run and aggregated over seeds (benchmarks/learning_stats.py): the return at fixed
env steps and wall-clock points, the final return, steps and seconds to --threshold, and for
each mode the wall-clock it needs to reach the peer's final return. Written to --out:
curves.csv (every eval point of every run, appended as each run ends, kind "untrained" (during
the warm-up, before any update: left out of the steps and seconds to --threshold), "periodic" or
"final": a rerun with the same --out skips the runs it holds and gives a held fastsac run
without a final row its final evaluation from its run_dir, so an interruption loses nothing), summary.md and
curves_steps.png / curves_seconds.png (every mode on the same axes).

    python benchmarks/bench_learning.py configs/halfcheetah_cpu.yaml --modes sync sb3 --seeds 1 2 3 \\
        --budget-s 1200 --threshold 8000 --out docs/learning/halfcheetah
    python benchmarks/bench_learning.py --smoke --out /tmp/smoke     # the smallest size (tests)
    python benchmarks/bench_learning.py --report --modes sync sb3 --budget-s 1200 --out docs/learning/halfcheetah
        # the table and plots again, from curves.csv (which does not hold the budget: --budget-s names it)

Modes: sync (trainer.asynchronous=false), async1 (1 collector, utd strict, no binding), async2
(2 collectors, utd strict, bound in-process one CPU each), sb3 (the peer; --sb3-env names its
Gymnasium task). Extra key=value arguments go to every fastsac run.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_stats import Point, describe, first_reach, mean, value_at  # noqa: E402
from process_group import CHILDREN  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODES = {
    "sync": ["trainer.asynchronous=false"],
    "async1": ["trainer.asynchronous=true", "trainer.async_options.utd_mode=strict",
               "trainer.async_options.num_collectors=1", "trainer.async_options.numa_binding=off"],
    "async2": ["trainer.asynchronous=true", "trainer.async_options.utd_mode=strict",
               "trainer.async_options.num_collectors=2", "trainer.async_options.numa_binding=inprocess"],
    "sb3": [],
}
CSV_FIELDS = ("mode", "seed", "env_steps", "seconds", "mean_return", "kind")
# the kinds of eval point: during the warm-up (no update yet: the initial policy), after it, the final one
UNTRAINED, PERIODIC, FINAL = "untrained", "periodic", "final"
SMOKE_CONFIG = "configs/quickstart.yaml"
SMOKE_OVERRIDES = ["trainer.num_iterations=60", "algo.learning_starts=10", "eval.interval=20", "eval.episodes=2",
                   "eval.num_envs=2", "logging.interval=20", "logging.interval_s=1", "checkpoint.interval=0"]
EVAL_STEPS_RE = re.compile(r"env step ([\d,]+)")       # fastsac-eval's first line: the checkpoint's env step
EVAL_RETURN_RE = re.compile(r"^return: mean (\S+)", re.M)
DEFAULT_BUDGET_S = 1200.0  # training wall-clock per run, unless --budget-s
STOP_GRACE_S = 120.0      # after SIGTERM: the final checkpoint, then the process group is killed


def run_for(cmd: list[str], log: Path, budget_s: float, uncounted=lambda: 0.0) -> int:
    """Run cmd (its own process group) until it ends or the budget is spent, then SIGTERM, and
    SIGKILL after STOP_GRACE_S; its exit code. The budget is on the training clock: `uncounted()`
    (seconds the run spent on anything else, e.g. inline evaluation) is added to it, as the peer
    stops on its training clock."""
    with open(log, "w") as out:
        proc = CHILDREN.start(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    start = time.monotonic()
    while (left := budget_s + uncounted() - (time.monotonic() - start)) > 0:
        try:
            code = proc.wait(timeout=left)
            CHILDREN.forget(proc)
            return code
        except subprocess.TimeoutExpired:
            continue
    return CHILDREN.stop(proc, grace_s=STOP_GRACE_S)


# --------------------------------------------------------------------------- one run
def tb_scalars(run_dir: Path, *tags: str) -> list[list]:
    """The events of each tag in a fastsac run's TensorBoard files ([] for a tag not written yet)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    written = acc.Tags()["scalars"]
    return [acc.Scalars(tag) if tag in written else [] for tag in tags]


def eval_seconds(run_dir: Path) -> float:
    """Seconds a sync run has spent on inline evaluation so far."""
    if not (run_dir / "tb").exists():
        return 0.0
    (costs,) = tb_scalars(run_dir, "eval/seconds")
    return sum(e.value for e in costs)


def fastsac_curve(run_dir: Path, t0: float, inline_eval: bool) -> list[Point]:
    """Eval points of a fastsac run from its TensorBoard files, seconds since t0 (wall)."""
    returns, costs = tb_scalars(run_dir, "eval/mean_return", "eval/seconds")
    costs = [e.value for e in costs] if inline_eval else [0.0] * len(returns)
    curve, spent = [], 0.0
    for e, cost in zip(returns, costs):
        spent += cost                 # the inline evaluation blocked training for `cost` seconds
        curve.append((int(e.step), e.wall_time - t0 - spent, float(e.value)))
    return curve


def final_eval(run_dir: Path, episodes: int, log: Path) -> tuple[int, float]:
    """(env steps, mean return) of deterministic episodes of the run's newest checkpoint, by
    fastsac-eval in a process of its own (its output appended to log)."""
    cmd = [sys.executable, "-m", "fastsac.tools.evaluate", str(run_dir), "--episodes", str(episodes)]
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
    proc = CHILDREN.start(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text, _ = proc.communicate()
    CHILDREN.forget(proc)
    with open(log, "a") as f:
        f.write(text)
    steps, ret = EVAL_STEPS_RE.search(text), EVAL_RETURN_RE.search(text)
    if proc.returncode != 0 or not steps or not ret:
        raise RuntimeError(f"final evaluation of {run_dir} failed (exit {proc.returncode}); see {log}")
    return int(steps.group(1).replace(",", "")), float(ret.group(1))


def run_fastsac(args, mode: str, seed: int, out: Path) -> list[Point]:
    run_dir = out / "runs" / f"{mode}_s{seed}"
    cmd = [sys.executable, "-m", "fastsac.launcher", args.config, *MODES[mode], f"seed={seed}",
           f"run_dir={run_dir}", f"job_name=bl{os.getpid() % 10000}{mode}{seed}", "logging.console=true",
           *args.overrides]
    inline_eval = mode == "sync"          # the sync trainer stops training to evaluate
    t0 = time.time()
    log = out / "runs" / f"{mode}_s{seed}.log"
    rc = run_for(cmd, log, args.budget_s, uncounted=lambda: eval_seconds(run_dir) if inline_eval else 0.0)
    trained_s = min(args.budget_s, time.time() - t0 - (eval_seconds(run_dir) if inline_eval else 0.0))
    if rc not in (0, -signal.SIGTERM):
        raise RuntimeError(f"{mode} seed {seed} failed (exit {rc}); see {log}")
    steps, ret = final_eval(run_dir, args.final_episodes, log)
    return fastsac_curve(run_dir, t0, inline_eval) + [(steps, trained_s, ret)]


def run_sb3(args, seed: int, out: Path) -> list[Point]:
    path = out / "runs" / f"sb3_s{seed}.csv"
    cmd = [sys.executable, str(REPO / "benchmarks" / "sb3_peer.py"), "--env", args.sb3_env, "--seed", str(seed),
           "--budget-s", str(args.budget_s), "--eval-every", str(args.sb3_eval_every),
           "--eval-episodes", str(args.sb3_eval_episodes), "--learning-starts", str(args.sb3_learning_starts),
           "--max-steps", str(args.sb3_max_steps), "--final-episodes", str(args.final_episodes), "--csv", str(path)]
    rc = run_for(cmd, out / "runs" / f"sb3_s{seed}.log", args.budget_s * 2 + 60)   # it stops itself on its clock
    if rc != 0:
        raise RuntimeError(f"sb3 seed {seed} failed (exit {rc}); see {out / 'runs' / f'sb3_s{seed}.log'}")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or rows[-1]["kind"] != FINAL:
        raise RuntimeError(f"sb3 seed {seed} wrote no final evaluation; see {path}")
    return [(int(r["env_steps"]), float(r["seconds"]), float(r["mean_return"])) for r in rows]


# --------------------------------------------------------------------------- curves on disk
RunKey = tuple[str, int]     # (mode, seed)


def load_curves(path: Path) -> tuple[dict[RunKey, list[Point]], set[RunKey], dict[RunKey, int]]:
    """The curves of path, the runs among them that have their final evaluation (the last point),
    and each run's warm-up: the env steps of its last evaluation before any update (0 if none)."""
    curves: dict[RunKey, list[Point]] = {}
    finished: set[RunKey] = set()
    warmups: dict[RunKey, int] = {}
    if path.exists():
        with open(path) as f:
            for r in csv.DictReader(f):
                key = (r["mode"], int(r["seed"]))
                curves.setdefault(key, []).append((int(r["env_steps"]), float(r["seconds"]), float(r["mean_return"])))
                if r["kind"] == FINAL:
                    finished.add(key)
                elif r["kind"] == UNTRAINED:
                    warmups[key] = max(warmups.get(key, 0), int(r["env_steps"]))
    return curves, finished, warmups


def append_curve(path: Path, mode: str, seed: int, curve: list[Point], warmup_steps: int = 0) -> None:
    """Append a run's points; the last one is its final evaluation, those at or before
    warmup_steps env steps evaluated the untrained policy."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f, lineterminator="\n")   # LF, as every other text file in the repository
        if new:
            w.writerow(CSV_FIELDS)
        for n, (steps, seconds, ret) in enumerate(curve, 1):
            kind = FINAL if n == len(curve) else UNTRAINED if steps <= warmup_steps else PERIODIC
            w.writerow((mode, seed, steps, round(seconds, 2), round(ret, 2), kind))


def warmup_steps(args, mode: str) -> int:
    """Env steps a run of mode takes before its first update: its evaluations up to there
    measure the initial policy."""
    if mode == "sb3":
        return args.sb3_learning_starts
    from fastsac.config import load_config
    cfg = load_config(args.config, [*MODES[mode], *args.overrides])
    return cfg.algo.learning_starts * cfg.env.num_envs


def finish_held_run(args, mode: str, seed: int, out: Path, csv_path: Path) -> Point | None:
    """The final evaluation of a held fastsac run that has none (its run_dir's newest checkpoint,
    at the budget on the training clock), appended to csv_path; None where its run_dir is gone."""
    run_dir = out / "runs" / f"{mode}_s{seed}"
    if mode == "sb3" or not run_dir.is_dir():
        return None
    steps, ret = final_eval(run_dir, args.final_episodes, out / "runs" / f"{mode}_s{seed}.log")
    point = (steps, args.budget_s, ret)
    append_curve(csv_path, mode, seed, [point])
    return point


# --------------------------------------------------------------------------- report
def summary(curves: dict[RunKey, list[Point]], warmups: dict[RunKey, int], modes: list[str], args) -> str:
    def reach(key: RunKey, target: float) -> tuple[int | None, float | None]:
        return first_reach(curves[key], target, warmups.get(key, 0))     # learning only: not the warm-up

    # curves.csv holds points, not the budget they ran under: a report knows it only from --budget-s
    budget = (f"budget {args.budget_s:.0f} s per run" if args.budget_s is not None
              else "budget per run: not stored in curves.csv (--budget-s names it)")
    lines = [f"{budget}; values: deterministic eval return, last evaluation at or "
             "before each point; over seeds: mean and IQM with 95% bootstrap intervals", ""]
    for mode in modes:
        for (m, seed), c in sorted(curves.items()):
            if m == mode:
                s, t = reach((m, seed), args.threshold)
                lines.append(f"{mode:7s} seed {seed}: final {c[-1][2]:8.1f} at {c[-1][0]:,} env steps / "
                             f"{c[-1][1]:.0f} s; best {max(p[2] for p in c):8.1f}; reached {args.threshold:g} "
                             + (f"at {s:,} steps / {t:.0f} s" if s is not None else "never"))
    lines += ["", "| mode | point | return over seeds |", "|---|---|---|"]
    for mode in modes:
        keys = sorted(key for key in curves if key[0] == mode)
        runs = [curves[key] for key in keys]
        if not runs:
            continue
        points = [(f"{x:,} env steps", x, "steps") for x in args.at_steps]
        points += [(f"{x:.0f} s", x, "seconds") for x in args.at_seconds]
        for label, x, axis in points:
            values = [value_at(c, x, axis) for c in runs]
            reached = sum(not math.isnan(v) for v in values)
            lines.append(f"| {mode} | {label} | {describe(values)}"
                         + (f"; {len(runs) - reached} of {len(runs)} runs did not get there" if reached < len(runs)
                            and reached else "") + " |")
        lines.append(f"| {mode} | final | {describe([c[-1][2] for c in runs])} |")
        hits = [reach(key, args.threshold) for key in keys]
        reached = [t for _, t in hits if t is not None]
        lines.append(f"| {mode} | seconds to {args.threshold:g} | {len(reached)}/{len(runs)} runs"
                     + (f", {describe(reached)}" if reached else "") + " |")
    peer = [c for (m, _), c in curves.items() if m == "sb3"]
    if peer:
        target = mean([c[-1][2] for c in peer])
        peer_time = mean([c[-1][1] for c in peer])
        lines += ["", f"the peer's final return (mean over {len(peer)} seeds): {target:,.0f} at {peer_time:.0f} s"]
        for mode in modes:
            if mode == "sb3":
                continue
            times = [reach(key, target)[1] for key in curves if key[0] == mode]
            got = [t for t in times if t is not None]
            ratio = f"{mean(got) / peer_time:.2f}x the peer's time" if got else "not reached"
            lines.append(f"{mode}: reaches it in {len(got)}/{len(times)} runs"
                         + (f", after {describe(got)} s: {ratio}" if got else ""))
    return "\n".join(lines) + "\n"


def plot(curves: dict[RunKey, list[Point]], modes: list[str], out: Path, title: str) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_learning: matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return []
    paths = []
    for axis, index, label in (("steps", 0, "env steps"), ("seconds", 1, "training wall-clock (s)")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for k, mode in enumerate(modes):
            runs = [c for (m, _), c in sorted(curves.items()) if m == mode]
            for n, c in enumerate(runs):       # one line per seed, one colour and legend entry per mode
                ax.plot([p[index] for p in c], [p[2] for p in c], color=f"C{k}", alpha=0.8, lw=1.2,
                        label=f"{mode} ({len(runs)} seeds)" if n == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("deterministic eval return")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / f"curves_{axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--modes", nargs="+", default=["sync", "sb3"], choices=list(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"training wall-clock per run (default {DEFAULT_BUDGET_S:.0f}); with --report: the header's")
    p.add_argument("--threshold", type=float, default=8000.0)
    p.add_argument("--at-steps", nargs="*", type=int, default=[50_000, 100_000, 150_000, 200_000])
    p.add_argument("--at-seconds", nargs="*", type=float, default=[300, 600, 900, 1200])
    p.add_argument("--sb3-env", default="HalfCheetah-v5")
    p.add_argument("--sb3-eval-every", type=int, default=8000)
    p.add_argument("--sb3-eval-episodes", type=int, default=10)
    p.add_argument("--sb3-learning-starts", type=int, default=10_000)
    p.add_argument("--sb3-max-steps", type=int, default=1_000_000)
    p.add_argument("--final-episodes", type=int, default=10, help="episodes of each run's final evaluation")
    p.add_argument("--out", required=True, help="folder for curves.csv, summary.md, the plots and the run logs")
    p.add_argument("--smoke", action="store_true", help="the smallest size: quick start, seconds per run")
    p.add_argument("--report", action="store_true", help="run nothing: the table and plots of --out's curves.csv")
    args = p.parse_intermixed_args()    # key=value overrides may follow the options
    if args.config and "=" in args.config and not Path(args.config).is_file():   # overrides only
        args.overrides, args.config = [args.config, *args.overrides], None
    if args.smoke:
        args.config, args.overrides = args.config or SMOKE_CONFIG, [*SMOKE_OVERRIDES, *args.overrides]
        args.threshold, args.at_steps, args.at_seconds = -1000.0, [640, 1280], [5.0]
        args.sb3_env, args.sb3_eval_every, args.sb3_eval_episodes = "Pendulum-v1", 200, 2
        args.sb3_learning_starts, args.sb3_max_steps, args.final_episodes = 100, 600, 2
    if args.budget_s is None and not args.report:
        args.budget_s = DEFAULT_BUDGET_S
    if args.config is None and not args.report:
        p.error("a config is needed (or --smoke, or --report)")
    out = Path(args.out)
    (out if args.report else out / "runs").mkdir(parents=True, exist_ok=True)   # a report runs nothing: no runs/
    csv_path = out / "curves.csv"
    curves, finished, warmups = load_curves(csv_path)
    for seed in [] if args.report else args.seeds:
        for mode in args.modes:              # interleaved: machine noise hits every mode alike
            if (mode, seed) in curves:
                point = None if (mode, seed) in finished else finish_held_run(args, mode, seed, out, csv_path)
                if point:
                    curves[(mode, seed)].append(point)
                print(f"{mode} seed {seed}: in {csv_path} already, skipped"
                      + (f"; its final evaluation: {point[2]:.1f} at {point[0]:,} env steps" if point else ""),
                      flush=True)
                continue
            curve = run_sb3(args, seed, out) if mode == "sb3" else run_fastsac(args, mode, seed, out)
            if not curve:
                print(f"{mode} seed {seed}: no evaluation point (is eval.interval on?)", file=sys.stderr)
                return 1
            warmups[(mode, seed)] = warmup_steps(args, mode)
            append_curve(csv_path, mode, seed, curve, warmups[(mode, seed)])
            curves[(mode, seed)] = curve
            print(f"{mode} seed {seed}: final eval return {curve[-1][2]:.1f} at {curve[-1][0]:,} env steps, "
                  f"{curve[-1][1]:.0f} s ({len(curve)} evaluations)", flush=True)
    modes = args.modes
    text = summary(curves, warmups, modes, args)
    (out / "summary.md").write_text(text)
    print("\n" + text)
    for path in plot(curves, modes, out, Path(args.config).stem if args.config else out.name):
        print(f"plot: {path}")
    return 0 if all(not math.isnan(c[-1][2]) for c in curves.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
