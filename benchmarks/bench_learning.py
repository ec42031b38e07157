"""Learning benchmark: return reached vs env steps and wall time, synchronous vs async.

Runs the real CLI (`fastsac-launch CONFIG ...`) once per (mode, seed), one run at a time,
and reads the TensorBoard scalars each run wrote. Prints one row per run and a summary
per mode, side by side, so the ratio between modes comes from one run of this script.

    python benchmarks/bench_learning.py configs/quickstart.yaml --modes sync async --seeds 1 2 3
    python benchmarks/bench_learning.py configs/quickstart.yaml --modes sync --seeds 1 2 3 trainer.num_iterations=2000

Modes: sync (trainer.asynchronous=false), async (true, utd_mode strict, 1 collector),
async_lb (learner_bound). Extra key=value arguments go to every run.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "sync": ["trainer.asynchronous=false"],
    "async": ["trainer.asynchronous=true", "trainer.async_options.utd_mode=strict"],
    "async_lb": ["trainer.asynchronous=true", "trainer.async_options.utd_mode=learner_bound"],
}


def read_run(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    ret = acc.Scalars("rollout/mean_return")
    sps = [e.value for e in acc.Scalars("perf/env_steps_per_s")]
    return {"returns": [(e.step, e.wall_time, e.value) for e in ret], "sps": sps}


def summarize(run: dict, threshold: float, t0: float) -> dict:
    r = run["returns"]
    last = [v for _, _, v in r[-3:]]
    hit = next(((s, w - t0) for s, w, v in r if v >= threshold), (None, None))
    return {"final": statistics.fmean(last) if last else float("nan"),
            "best": max((v for _, _, v in r), default=float("nan")),
            "steps_to_threshold": hit[0], "seconds_to_threshold": hit[1],
            "env_steps": r[-1][0] if r else 0,
            "env_steps_per_s": statistics.median(run["sps"]) if run["sps"] else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=sorted(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--threshold", type=float, default=-200.0, help="'solved' return (pendulum: -200)")
    p.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastsac_bench_learning_") as tmp:
        for seed in args.seeds:
            for mode in args.modes:  # interleaved: machine noise hits both modes alike
                run_dir = Path(tmp) / f"{mode}_s{seed}"
                cmd = [sys.executable, "-m", "fastsac.launcher", args.config, *MODES[mode], f"seed={seed}",
                       f"run_dir={run_dir}", f"job_name=bench_{mode}_{seed}", "logging.console=false",
                       *args.overrides]
                t0 = time.time()
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                wall = time.time() - t0
                if proc.returncode != 0:
                    print(f"{mode} seed {seed} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                    return 1
                s = summarize(read_run(run_dir), args.threshold, t0)
                s.update(mode=mode, seed=seed, wall=wall)
                rows.append(s)
                print(f"{mode:9s} seed {seed}: final return {s['final']:8.1f}  best {s['best']:8.1f}  "
                      f"reached {args.threshold:g} at {s['steps_to_threshold']} steps / "
                      f"{s['seconds_to_threshold'] and round(s['seconds_to_threshold'], 1)} s  "
                      f"wall {wall:6.1f} s  {s['env_steps_per_s']:8.0f} env-steps/s", flush=True)
    print("\nmode       final return (mean ± sd over seeds)   wall s   env-steps/s   s to threshold")
    for mode in args.modes:
        rs = [r for r in rows if r["mode"] == mode]
        finals = [r["final"] for r in rs]
        sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
        hits = [r["seconds_to_threshold"] for r in rs if r["seconds_to_threshold"] is not None]
        print(f"{mode:9s}  {statistics.fmean(finals):9.1f} ± {sd:5.1f} (min {min(finals):.1f}, max {max(finals):.1f})"
              f"   {statistics.fmean(r['wall'] for r in rs):7.1f}   {statistics.fmean(r['env_steps_per_s'] for r in rs):10.0f}"
              f"   {statistics.fmean(hits) if hits else float('nan'):8.1f} ({len(hits)}/{len(rs)} runs)")
    if len(args.modes) > 1:
        base = args.modes[0]
        for mode in args.modes[1:]:
            w0 = statistics.fmean(r["wall"] for r in rows if r["mode"] == base)
            w1 = statistics.fmean(r["wall"] for r in rows if r["mode"] == mode)
            print(f"wall-clock ratio {base}/{mode}: {w0 / w1:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
