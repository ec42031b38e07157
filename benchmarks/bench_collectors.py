"""Aggregate collection throughput with 1 vs N collectors, same total num_envs, same CPUs each.

Runs the real CLI with every collector bound to its own --cpus-per-collector CPUs (binding
explicitly on: numactl, else in-process; the 1-collector run too, so this measures scaling per
CPU slice), collection-only by default (algo.num_updates=0: the learner still drains every ring
and broadcasts weights), and reads perf/env_steps_per_s (all collectors),
collector{i}/env_steps_per_s, perf/learn_pct and perf/updates_per_s from TensorBoard. Then the
same N-collector job with collector 0 made 3x slower (Humanoid only): if the other collectors
keep their throughput, a slow collector holds nobody back.

Placement: `spread` (default: one collector per NUMA node where there are several, the
acceptance setup) or `colocate` (all on the learner's node). For the acceptance criteria against
the unbound single collector, with learning on, use benchmarks/bench_acceptance.py.

    python benchmarks/bench_collectors.py                      # humanoid, 256 envs, 1 vs 2 collectors
    python benchmarks/bench_collectors.py --env halfcheetah --num-envs 512 --collectors 1 2 --rounds 3
    python benchmarks/bench_collectors.py --train              # learner trains (config's num_updates; GPU)
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402


def run(config: str, run_dir: Path, job: str, extra: list[str], timeout: float,
        log_interval_s: float) -> dict[str, list[float]]:
    cmd = [sys.executable, "-m", "fastsac.launcher", config, f"run_dir={run_dir}", f"job_name={job}",
           "logging.console=false", f"logging.interval_s={log_interval_s}", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = CHILDREN.run(cmd, timeout=timeout, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def steady(values: list[float]) -> float:
    """Median after dropping the first sample (start-up) and the last (drain at the end)."""
    core = values[1:-1] if len(values) > 3 else values
    return statistics.median(core) if core else float("nan")


def default_binding() -> str:
    return "numactl" if shutil.which("numactl") and Path("/sys/devices/system/node").is_dir() else "inprocess"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/humanoid.yaml")
    p.add_argument("--env", default="humanoid")
    p.add_argument("--num-envs", type=int, default=256)
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--cpus-per-collector", type=int, default=1)
    p.add_argument("--placement", choices=["spread", "colocate"], default="spread")
    p.add_argument("--iterations", type=int, default=400, help="run length in env-step batches")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (each runs every collector count)")
    p.add_argument("--log-interval-s", type=float, default=2.0, help="logging.interval_s of every run")
    p.add_argument("--log-interval", type=int, default=None, help="logging.interval (batches); default: the config's")
    p.add_argument("--binding", choices=["numactl", "inprocess", "auto", "off"], default=default_binding(),
                   help="numa_binding of every run (default: on, numactl where it runs, else inprocess)")
    p.add_argument("--train", action="store_true", help="let the learner train (the config's num_updates; GPU)")
    p.add_argument("--no-slow", action="store_true", help="skip the slowed-collector run")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    for name in ("num_envs", "iterations", "rounds", "log_interval_s", "timeout"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is not valid; expected a positive value")
    if min(args.collectors) < 1:
        p.error(f"--collectors: {args.collectors} is not valid; expected counts >= 1")
    common = [f"env.num_envs={args.num_envs}", f"trainer.num_iterations={args.iterations}",
              "trainer.asynchronous=true", f"trainer.async_options.numa_binding={args.binding}",
              f"trainer.async_options.placement={args.placement}",
              f"trainer.async_options.cpus_per_collector={args.cpus_per_collector}",
              "trainer.async_options.collector_inference_device=cpu", "algo.learning_starts=0",
              "checkpoint.interval=0"]
    if args.log_interval is not None:
        common.append(f"logging.interval={args.log_interval}")
    if not args.train:
        common += ["algo.num_updates=0", "device=cpu", "algo.compile=false", "algo.amp=false"]
    print(f"# {args.env}, {args.num_envs} envs in all, binding {args.binding}, placement {args.placement}, "
          f"{args.cpus_per_collector} CPU(s) per collector, {'learner training' if args.train else 'collection only'}; "
          f"per run the median of its log points without the first and last")
    results: dict[int, list[dict]] = {n: [] for n in args.collectors}
    job = f"benchc{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="fastsac_bench_collectors_") as tmp:
        for r in range(args.rounds):
            for n in args.collectors:
                tags = run(args.config, Path(tmp) / f"r{r}c{n}", f"{job}_{r}_{n}",
                           [*common, f"env.name={args.env}", f"trainer.async_options.num_collectors={n}"],
                           args.timeout, args.log_interval_s)
                res = {"total": steady(tags["perf/env_steps_per_s"]),
                       "per": [steady(tags.get(f"collector{i}/env_steps_per_s", [])) for i in range(n)],
                       "updates": steady(tags.get("perf/updates_per_s", [0.0])),
                       "learn": steady(tags.get("perf/learn_pct", [0.0]))}
                results[n].append(res)
                print(f"{n} collector(s): {res['total']:9.0f} env-steps/s in all | per collector "
                      + ", ".join(f"{x:.0f}" for x in res["per"])
                      + f" | learner {res['updates']:.1f} updates/s, learn {res['learn']:.1f}%", flush=True)
        base = args.collectors[0]
        for n in args.collectors[1:]:
            rr = [a["total"] / b["total"] for a, b in zip(results[n], results[base])]
            print(f"scaling {n} vs {base} collector(s): {statistics.median(rr):.2f}x"
                  + (f" [{min(rr):.2f}-{max(rr):.2f}] over {len(rr)} rounds" if len(rr) > 1 else ""))
        n = max(args.collectors)
        if not args.no_slow and n > 1 and args.env == "humanoid":
            tags = run(args.config, Path(tmp) / "slow", f"{job}_slow",
                       [*common, "env.name=benchmarks.slow_env:SlowHumanoid",
                        f"trainer.async_options.num_collectors={n}"], args.timeout, args.log_interval_s)
            per = [steady(tags.get(f"collector{i}/env_steps_per_s", [])) for i in range(n)]
            unslowed = [statistics.median(res["per"][i] for res in results[n]) for i in range(n)]
            print(f"{n} collectors, collector 0 slowed 3x: per collector " + ", ".join(f"{x:.0f}" for x in per))
            for i in range(1, n):
                print(f"  collector {i}: {per[i]:.0f} vs {unslowed[i]:.0f} env-steps/s unslowed "
                      f"({per[i] / unslowed[i]:.2f}x); collector 0: {per[0] / unslowed[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
