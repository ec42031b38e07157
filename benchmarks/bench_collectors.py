"""Aggregate collection throughput with 1 vs N collectors, same total num_envs.

Runs the real CLI, collection-only (algo.num_updates=0: the learner still drains every ring
and broadcasts weights), each collector bound to its own CPU(s), and reads
perf/env_steps_per_s (sum over collectors) and collector{i}/env_steps_per_s from
TensorBoard. Then the same N-collector job with collector 0 made 3x slower: if the other
collectors keep their throughput, a slow collector holds nobody back.

    python benchmarks/bench_collectors.py                      # humanoid, 256 envs, 1 vs 2 collectors
    python benchmarks/bench_collectors.py --env halfcheetah --num-envs 512 --collectors 1 2

On a GPU machine pass --train to let the learner train (algo.num_updates from the config).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(config: str, run_dir: Path, job: str, extra: list[str], timeout: float) -> dict[str, list[float]]:
    cmd = [sys.executable, "-m", "fastsac.launcher", config, f"run_dir={run_dir}", f"job_name={job}",
           "logging.console=false", "logging.interval_s=2", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def steady(values: list[float]) -> float:
    """Median after dropping the first sample (start-up) and the last (drain at the end)."""
    core = values[1:-1] if len(values) > 3 else values
    return statistics.median(core) if core else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/humanoid.yaml")
    p.add_argument("--env", default="humanoid")
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cpus-per-collector", type=int, default=1)
    p.add_argument("--iterations", type=int, default=400, help="run length in env-step batches")
    p.add_argument("--binding", default="auto", help="numa_binding for the runs")
    p.add_argument("--train", action="store_true", help="let the learner train (GPU machines)")
    p.add_argument("--no-slow", action="store_true", help="skip the slowed-collector run")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    common = [f"env.num_envs={args.num_envs}", f"trainer.num_iterations={args.iterations}",
              "trainer.asynchronous=true", f"trainer.async_options.numa_binding={args.binding}",
              "trainer.async_options.placement=colocate",
              f"trainer.async_options.cpus_per_collector={args.cpus_per_collector}",
              "trainer.async_options.collector_inference_device=cpu", "algo.learning_starts=0",
              "checkpoint.interval=0"]
    if not args.train:
        common += ["algo.num_updates=0", "device=cpu", "algo.compile=false", "algo.amp=false"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="fastsac_bench_collectors_") as tmp:
        for n in args.collectors:
            tags = run(args.config, Path(tmp) / f"c{n}", f"benchc{n}",
                       [*common, f"env.name={args.env}", f"trainer.async_options.num_collectors={n}"], args.timeout)
            results[n] = {"total": steady(tags["perf/env_steps_per_s"]),
                          "per": [steady(tags.get(f"collector{i}/env_steps_per_s", [])) for i in range(n)],
                          "updates": steady(tags.get("perf/updates_per_s", [0.0]))}
            r = results[n]
            print(f"{n} collector(s): {r['total']:9.0f} env-steps/s in all | per collector "
                  + ", ".join(f"{x:.0f}" for x in r["per"]) + f" | learner {r['updates']:.1f} updates/s", flush=True)
        base = args.collectors[0]
        for n in args.collectors[1:]:
            print(f"scaling {n} vs {base} collector(s): {results[n]['total'] / results[base]['total']:.2f}x")
        n = max(args.collectors)
        if not args.no_slow and n > 1 and args.env == "humanoid":
            tags = run(args.config, Path(tmp) / "slow", "benchslow",
                       [*common, "env.name=benchmarks.slow_env:SlowHumanoid",
                        f"trainer.async_options.num_collectors={n}"], args.timeout)
            per = [steady(tags.get(f"collector{i}/env_steps_per_s", [])) for i in range(n)]
            print(f"{n} collectors, collector 0 slowed 3x: per collector " + ", ".join(f"{x:.0f}" for x in per))
            for i in range(1, n):
                print(f"  collector {i}: {per[i]:.0f} vs {results[n]['per'][i]:.0f} env-steps/s unslowed "
                      f"({per[i] / results[n]['per'][i]:.2f}x); collector 0: {per[0] / results[n]['per'][0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
