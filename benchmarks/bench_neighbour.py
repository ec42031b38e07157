"""Neighbour benchmark: each trainer's throughput beside a busy process on one CPU, paired against
the same run on a quiet machine.

A shared box is the common case (a browser, a compile, another job): the trainer must not
collapse when one of its CPUs is taken. Each round runs every mode twice, quiet and beside a
neighbour (a Python busy loop pinned to the last allowed CPU), in alternating order, and reports
the trainer's updates/s and env-steps/s (the means of its logged windows after a warm-up, from
run_dir/metrics.jsonl) and the ratio neighbour / quiet per round. The physical bound: with one
of N CPUs taken, a CPU-bound trainer keeps at most (N - 1) / N of its quiet rate; the goal is
>= 0.75x on 2 CPUs.

    python benchmarks/bench_neighbour.py                              # sync and async, 3 rounds
    python benchmarks/bench_neighbour.py --modes sync --rounds 5 --seconds 60
    python benchmarks/bench_neighbour.py --smoke                      # the smallest size (a test)
    python benchmarks/bench_neighbour.py --quiet-only --config configs/halfcheetah_cpu.yaml --seconds 60
                                  # no neighbour: sync vs async updates/s, paired (async / sync per round)

Every run is stopped by SIGTERM (its process group), the neighbour by SIGKILL; a stopped
benchmark stops both.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402
MODES = {"sync": ["trainer.asynchronous=false"], "async": ["trainer.asynchronous=true"]}
COMMON = ["trainer.num_iterations=100000000", "checkpoint.interval=0", "eval.interval=0", "logging.interval_s=2",
          "logging.console=false"]
SPINNER = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def rates(metrics: Path, warmup_s: float) -> tuple[float, float]:
    """(updates/s, env-steps/s): the means of the logged windows that ended after the warm-up."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    rows = [r for r in rows if "perf/updates_per_s" in r]
    if not rows:
        return float("nan"), float("nan")
    t0 = rows[0]["wall_time"]
    late = [r for r in rows if r["wall_time"] - t0 >= warmup_s] or rows[-1:]
    return (statistics.fmean(r["perf/updates_per_s"] for r in late),
            statistics.fmean(r["perf/env_steps_per_s"] for r in late))


def one_run(args, mode: str, neighbour: bool, work: Path, tag: str) -> tuple[float, float]:
    run_dir = work / tag
    spinner = None
    if neighbour:
        cpu = max(os.sched_getaffinity(0))
        spinner = CHILDREN.start([sys.executable, "-c", SPINNER, str(cpu)], cwd=REPO)
    cmd = [sys.executable, "-m", "fastsac.launcher", args.config, *MODES[mode], *COMMON, f"run_dir={run_dir}",
           f"job_name=bn{os.getpid() % 100000}{tag}", *args.overrides]
    with open(work / f"{tag}.log", "w") as log:
        proc = CHILDREN.start(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=args.seconds)
            raise RuntimeError(f"{tag} ended early (exit {proc.returncode}); see {work / (tag + '.log')}")
        except subprocess.TimeoutExpired:
            CHILDREN.stop(proc, grace_s=60.0)
        finally:
            if spinner is not None:
                CHILDREN.stop(spinner, signal.SIGKILL, 5.0)
    return rates(run_dir / "metrics.jsonl", args.warmup_s)


def quiet_only(args) -> int:
    """The modes on a quiet machine in paired rounds (the order alternates): updates/s, env-steps/s
    and, with sync and async, async / sync per round."""
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory(prefix="bench_neighbour_") as tmp:
        for r in range(args.rounds):
            for mode in (args.modes if r % 2 == 0 else args.modes[::-1]):
                got[mode].append(one_run(args, mode, False, Path(tmp), f"{mode}{r}q"))
                print(f"round {r + 1} {mode:5s}: {got[mode][-1][0]:7.1f} upd/s {got[mode][-1][1]:9,.0f} env-steps/s",
                      flush=True)
    for mode, rows in got.items():
        print(f"{mode}: {statistics.median(u for u, _ in rows):.1f} upd/s (median of {len(rows)})")
    if {"sync", "async"} <= set(got):
        ratios = [a[0] / s[0] for s, a in zip(got["sync"], got["async"])]
        print(f"async / sync updates/s: {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=list(MODES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=45.0, help="wall-clock per run")
    p.add_argument("--warmup-s", type=float, default=15.0, help="log windows before this are not counted")
    p.add_argument("--smoke", action="store_true", help="the smallest size: 1 round of sync, seconds per run")
    p.add_argument("--quiet-only", action="store_true", help="no neighbour runs: the modes against each other")
    args = p.parse_intermixed_args()
    if args.smoke:
        args.modes, args.rounds, args.seconds, args.warmup_s = ["sync"], 1, 12.0, 0.0
        args.overrides = ["algo.learning_starts=2", "env.num_envs=8", *args.overrides]
    cpus = len(os.sched_getaffinity(0))
    results: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in args.modes}
    if args.quiet_only:
        return quiet_only(args)
    with tempfile.TemporaryDirectory(prefix="bench_neighbour_") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for mode in args.modes:
                order = (False, True) if r % 2 == 0 else (True, False)   # paired, interleaved
                got = {nb: one_run(args, mode, nb, work, f"{mode}{r}{'n' if nb else 'q'}") for nb in order}
                (qu, qe), (nu, ne) = got[False], got[True]
                results[mode].append((qu, qe, nu, ne))
                print(f"round {r + 1} {mode:5s}: quiet {qu:7.1f} upd/s {qe:9,.0f} env-steps/s | neighbour "
                      f"{nu:7.1f} upd/s {ne:9,.0f} env-steps/s | ratio {nu / qu:.2f}x updates, {ne / qe:.2f}x env steps",
                      flush=True)
    bound = (cpus - 1) / cpus if cpus > 1 else 0.0
    print(f"\n{cpus} CPUs; one taken by the neighbour: a CPU-bound trainer keeps at most {bound:.2f}x; goal >= 0.75x")
    print("| mode | quiet upd/s | neighbour upd/s | ratio (median of rounds) | env-steps/s ratio |")
    print("|---|---|---|---|---|")
    for mode, rows in results.items():
        ratios = [nu / qu for qu, _, nu, _ in rows]
        env_ratios = [ne / qe for _, qe, _, ne in rows]
        print(f"| {mode} | {statistics.median(r[0] for r in rows):.1f} | {statistics.median(r[2] for r in rows):.1f} | "
              f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] | "
              f"{statistics.median(env_ratios):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
