"""What evaluation during training costs the async trainer: the same short job with eval off and
eval on, paired, in interleaved rounds (the order alternates per round so drift cancels).

Each run is the real CLI (`fastsac-launch CONFIG ...`, its own job_name and run_dir); its
TensorBoard scalars give the learner's updates/s and the collectors' env steps/s as the median
over its log windows once updates run (perf/updates_per_s > 0). Per round: the ratio on/off of
both (1.00x = free); the summary prints their median and [min-max] over the rounds, the eval
points the "on" runs logged and the time one evaluation took.

    python benchmarks/bench_eval_cost.py configs/quickstart.yaml --rounds 3
    python benchmarks/bench_eval_cost.py configs/quickstart.yaml --rounds 3 --interval 100 --episodes 16
    python benchmarks/bench_eval_cost.py --smoke          # the smallest size (tests/process/repo/test_benchmarks_smoke_process.py)

Extra key=value arguments go to every run (e.g. trainer.num_iterations=600).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402
SMOKE = ["trainer.num_iterations=120", "logging.interval=20", "logging.interval_s=1", "algo.learning_starts=20"]


def read_run(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    ups = [e.value for e in acc.Scalars("perf/updates_per_s")]
    sps = [e.value for e in acc.Scalars("perf/env_steps_per_s")]
    # windows once updates run; the final window of a run that just logged can read 0 (docs/operations.md, metric names)
    keep = [i for i, u in enumerate(ups) if u > 0]
    evals = [e.value for e in acc.Scalars("eval/mean_return")] if "eval/mean_return" in tags else []
    return {"updates_per_s": statistics.median(ups[i] for i in keep) if keep else float("nan"),
            "env_steps_per_s": statistics.median(sps[i] for i in keep) if keep else float("nan"),
            "eval_points": len(evals)}


def eval_seconds(run_dir: Path) -> list[float]:
    """Seconds each evaluation took, from the evaluator's log lines."""
    log = run_dir / "logs" / "evaluator.log"
    if not log.exists():
        return []
    return [float(line.rsplit(" in ", 1)[1].rstrip("s\n")) for line in log.read_text().splitlines()
            if "eval @ " in line and " episodes in " in line]


def run(config: str, overrides: list[str], tmp: Path, name: str, timeout: float) -> tuple[dict, float, list[float]]:
    run_dir = tmp / name
    job = f"bev{os.getpid() % 100000}{name}"
    t0 = time.perf_counter()
    proc = CHILDREN.run([sys.executable, "-m", "fastsac.launcher", config, *overrides, f"job_name={job}",
                         f"run_dir={run_dir}", "checkpoint.interval=0"], timeout=timeout, cwd=REPO)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_eval_cost: run {name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}")
    return read_run(run_dir), wall, eval_seconds(run_dir)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default=str(REPO / "configs" / "quickstart.yaml"))
    p.add_argument("overrides", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=int, default=100, help="eval.interval of the 'on' runs (iterations)")
    p.add_argument("--episodes", type=int, default=16, help="eval.episodes of the 'on' runs")
    p.add_argument("--eval-envs", type=int, default=16, help="eval.num_envs of the 'on' runs")
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--keep", help="keep every run's run_dir (TensorBoard files, logs) under this directory")
    p.add_argument("--smoke", action="store_true", help="smallest size: 1 round of 120 iterations, eval every 40")
    args = p.parse_args()
    overrides = list(args.overrides)
    if args.smoke:
        args.rounds, args.interval, args.episodes, args.eval_envs = 1, 40, 2, 2
        overrides = SMOKE + overrides
    for key, value in (("--rounds", args.rounds), ("--interval", args.interval), ("--episodes", args.episodes),
                       ("--eval-envs", args.eval_envs)):
        if value < 1:
            print(f"bench_eval_cost: error: {key}: {value} is not valid; expected an integer >= 1", file=sys.stderr)
            return 2
    on = [f"eval.interval={args.interval}", f"eval.episodes={args.episodes}", f"eval.num_envs={args.eval_envs}"]
    modes = {"off": ["eval.interval=0"], "on": on}
    print(f"# bench_eval_cost: {args.config} {' '.join(overrides)}; on = {' '.join(on)}; {args.rounds} round(s), "
          "order alternating")
    print(f"{'round':<6} {'order':<7} {'upd/s off':>10} {'upd/s on':>9} {'ratio':>6} {'env/s off':>10} "
          f"{'env/s on':>9} {'ratio':>6} {'wall off':>9} {'wall on':>8} {'evals':>5}")
    ups_r, sps_r, secs, points = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="fastsac_bench_eval_") as tmpdir:
        tmp = Path(args.keep or tmpdir)
        for r in range(1, args.rounds + 1):
            order = ["off", "on"] if r % 2 else ["on", "off"]
            res = {}
            for m in order:
                res[m] = run(args.config, overrides + modes[m], tmp, f"r{r}{m}", args.timeout)
            (off, woff, _), (onr, won, s) = res["off"], res["on"]
            ups_r.append(onr["updates_per_s"] / off["updates_per_s"])
            sps_r.append(onr["env_steps_per_s"] / off["env_steps_per_s"])
            secs += s
            points.append(onr["eval_points"])
            print(f"{r:<6} {'/'.join(order):<7} {off['updates_per_s']:>10.1f} {onr['updates_per_s']:>9.1f} "
                  f"{ups_r[-1]:>5.2f}x {off['env_steps_per_s']:>10,.0f} {onr['env_steps_per_s']:>9,.0f} "
                  f"{sps_r[-1]:>5.2f}x {woff:>8.1f}s {won:>7.1f}s {onr['eval_points']:>5}", flush=True)
    print(f"learner updates/s on/off: {spread(ups_r)}")
    print(f"env steps/s on/off: {spread(sps_r)}")
    print(f"eval points per 'on' run: {min(points)}-{max(points)}; one evaluation took "
          + (f"{statistics.median(secs):.2f}s median ({len(secs)} evaluations)" if secs else "n/a"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
