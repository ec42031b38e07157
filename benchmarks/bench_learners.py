"""Data-parallel learners: FastSAC updates/s of 1 learner vs 2 (torch.distributed), same per-learner batch.

    python benchmarks/bench_learners.py                       # gloo on this machine's CPUs
    python benchmarks/bench_learners.py --device cuda --backend nccl   # 2+ GPUs: one learner per GPU
    python benchmarks/bench_learners.py --e2e configs/quickstart.yaml  # whole jobs: 1 vs 2 learners

Every measurement starts fresh learner processes (this script with --worker): 1 learner with no
process group (today's code path, grad_sync None), or 2 learners joined in a LearnerGroup with
gradient averaging installed, each on its own batch of --batch transitions. After --warmup
updates each times --updates updates (the 2-learner time is rank 0's, after a final collective,
so it covers the slower rank). Rounds are paired and interleaved (1 then 2, then 2 then 1, ...)
so machine noise hits both alike; per round:

  updates/s        gradient steps per second of the job (2 learners: lockstep, one step = both)
  samples/s ratio  2 learners train on 2 x batch per step: (2 x updates/s of 2) / (updates/s of 1);
                   the physical bound is 2.0x (two learners can at most double the samples/s,
                   and only with a device each: on a 2-core box they share the cores with each
                   other and everything else)
  all-reduce %     share of the 2 learners' update time spent in the gradient all-reduce (rank 0)

Networks and batch: synthetic batches (random observations/actions of --obs-dim/--act-dim),
algo sizes from the flags; no envs, no replay buffer: only the update and its all-reduces.

--e2e CONFIG: whole async jobs through the real CLI (fastsac-launch), the same config with the
same --collectors (default 2) and env.num_envs, once with 1 learner and once with
distributed.num_learners=2 (each learner then owns its collectors' envs), paired and
interleaved per round; reads the job's perf/env_steps_per_s and perf/updates_per_s from
TensorBoard (rank 0 logs the job's totals), each run's median over its log points without the
first and last. One update of 2 learners trains on 2 x batch_size transitions; in strict
utd_mode both do the same number of updates per env step. Extra key=value arguments go to
every run.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402


# ---------------------------------------------------------------------------- worker
def worker(args) -> int:
    import numpy as np
    import torch

    from fastsac.algo.fastsac import FastSAC
    from fastsac.config import AlgoConfig, Config
    from fastsac.process.torch_runtime import configure_torch, open_device

    configure_torch()
    torch.set_num_threads(args.threads)
    # rank r on cuda:r, made current before the agent is built (else its context and streams are GPU 0's)
    device = open_device(args.device if args.device != "cuda" else f"cuda:{args.rank}")
    algo = AlgoConfig(actor_hidden_dim=args.actor_hidden, critic_hidden_dim=args.critic_hidden,
                      actor_num_layers=args.layers, critic_num_layers=args.layers, num_atoms=args.atoms,
                      batch_size=args.batch, policy_frequency=2)
    low, high = -np.ones(args.act_dim, np.float32), np.ones(args.act_dim, np.float32)
    torch.manual_seed(args.rank)
    agent = FastSAC(args.obs_dim, 0, args.act_dim, low, high, algo, device)
    group = None
    if args.world > 1:
        from fastsac.learner.distributed import LearnerGroup
        cfg = Config()
        d = cfg.distributed
        d.num_learners, d.nnodes, d.node_rank = args.world, 1, 0
        d.master_addr, d.master_port, d.backend, d.timeout_s = "127.0.0.1", args.port, args.backend, 120.0
        group = LearnerGroup.join(cfg, args.rank, device, log=lambda m: None)
        group.broadcast_agent(agent)
        group.install(agent)
        reduce = agent.grad_sync
        spent = [0.0]

        def timed_reduce(params):
            t0 = time.perf_counter()
            reduce(params)
            spent[0] += time.perf_counter() - t0

        agent.grad_sync = timed_reduce
    g = torch.Generator().manual_seed(100 + args.rank)
    n = args.batch
    batches = [{"obs": torch.randn(n, args.obs_dim, generator=g).to(device),
                "actions": (torch.rand(n, args.act_dim, generator=g) * 2 - 1).to(device),
                "rewards": torch.randn(n, generator=g).to(device),
                "next_obs": torch.randn(n, args.obs_dim, generator=g).to(device),
                "bootstrap": torch.ones(n, device=device), "discount": torch.full((n,), 0.97, device=device),
                "critic_obs": None, "next_critic_obs": None} for _ in range(4)]

    def run(k: int) -> None:
        for i in range(k):
            agent.update(batches[i % len(batches)])
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run(args.warmup)
    if group is not None:
        group.gather(0.0)              # start together
        spent[0] = 0.0
    t0 = time.perf_counter()
    run(args.updates)
    if group is not None:
        group.gather(0.0)              # rank 0's time then covers the slower rank
    seconds = time.perf_counter() - t0
    result = {"rank": args.rank, "updates_per_s": args.updates / seconds,
              "reduce_share": (spent[0] / seconds) if group is not None else 0.0}
    if group is not None:
        group.close()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------- end to end
def run_job(args, learners: int, run_dir: Path, job: str) -> dict:
    """One whole job through the CLI; steady medians of its perf scalars."""
    cmd = [sys.executable, "-m", "fastsac.launcher", args.e2e, f"run_dir={run_dir}", f"job_name={job}",
           "logging.console=false", f"logging.interval_s={args.log_interval_s}", "checkpoint.interval=0",
           "trainer.asynchronous=true", f"trainer.async_options.num_collectors={args.collectors}",
           f"trainer.num_iterations={args.iterations}", *args.overrides]
    if learners > 1:
        cmd += [f"distributed.num_learners={learners}", "distributed.master_addr=127.0.0.1",
                f"distributed.master_port={free_port()}"]
    proc = CHILDREN.run(cmd, timeout=args.timeout, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    return {"env_steps_per_s": steady(tags.get("perf/env_steps_per_s", [])),
            "updates_per_s": steady(tags.get("perf/updates_per_s", []))}


def steady(values: list[float]) -> float:
    """Median after dropping the first log point (start-up) and the last (the end)."""
    core = values[1:-1] if len(values) > 3 else values
    return statistics.median(core) if core else float("nan")


def end_to_end(args) -> int:
    import tempfile
    print(f"# bench_learners --e2e {args.e2e}: {args.collectors} collectors, {args.iterations} iterations per job, "
          f"overrides {args.overrides or '-'}; nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at start")
    print("# per job the median of its log points (every logging.interval_s) without the first and last; "
          "2 learners: one update = 2 x batch_size transitions")
    got: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="fastsac_bench_learners_") as tmp:
        for r in range(args.rounds):
            order = (1, 2) if r % 2 == 0 else (2, 1)
            res = {n: run_job(args, n, Path(tmp) / f"r{r}l{n}", f"benchl{os.getpid()}_{r}_{n}") for n in order}
            for n in (1, 2):
                got[n].append(res[n])
            print(f"round {r + 1}  1 learner {res[1]['env_steps_per_s']:8.0f} env-steps/s "
                  f"{res[1]['updates_per_s']:6.1f} updates/s   2 learners {res[2]['env_steps_per_s']:8.0f} env-steps/s "
                  f"{res[2]['updates_per_s']:6.1f} updates/s", flush=True)
    for key, what in (("env_steps_per_s", "env-steps/s"), ("updates_per_s", "updates/s")):
        ratios = [b[key] / a[key] for a, b in zip(got[1], got[2])]
        print(f"{what} 2 vs 1 learner(s): {spread(ratios)}x  (1: {spread([g[key] for g in got[1]], '{:.1f}')}, "
              f"2: {spread([g[key] for g in got[2]], '{:.1f}')})")
    print(f"# load average {os.getloadavg()[0]:.2f} at end")
    return 0


# ---------------------------------------------------------------------------- driver
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, world: int) -> dict:
    """One measurement: `world` fresh learner processes; rank 0's result."""
    port = free_port()
    common = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
              ("batch", "critic_hidden", "actor_hidden", "layers", "atoms", "obs_dim", "act_dim", "threads",
               "warmup", "updates", "device", "backend")]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", f"--rank={r}", f"--world={world}",
                               f"--port={port}", *common], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=args.timeout)
            outs.append(out)
            if p.returncode != 0:
                raise RuntimeError(f"learner worker exit {p.returncode}:\n{out[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    line = next(x for x in outs[0].splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--updates", type=int, default=200, help="timed updates per measurement")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=256, help="per learner")
    p.add_argument("--critic-hidden", type=int, default=128)
    p.add_argument("--actor-hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--atoms", type=int, default=51)
    p.add_argument("--obs-dim", type=int, default=17)
    p.add_argument("--act-dim", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads per learner")
    p.add_argument("--device", default="cpu", help="cpu | cuda (learner r on cuda:r)")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout", type=float, default=600.0, help="per measurement, seconds")
    p.add_argument("--e2e", metavar="CONFIG", help="whole jobs through the CLI: 1 vs 2 learners")
    p.add_argument("--collectors", type=int, default=2, help="--e2e: collectors per job")
    p.add_argument("--iterations", type=int, default=1000, help="--e2e: trainer.num_iterations per job")
    p.add_argument("--log-interval-s", type=float, default=1.0, help="--e2e: logging.interval_s")
    p.add_argument("overrides", nargs="*", help="--e2e: key=value for every job")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    for name in ("rounds", "updates", "batch", "critic_hidden", "actor_hidden", "layers", "obs_dim", "act_dim",
                 "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} (must be >= 1)")
    if args.atoms < 2 or args.warmup < 0:
        p.error(f"--atoms: {args.atoms} (must be >= 2) / --warmup: {args.warmup} (must be >= 0)")
    if args.worker:
        return worker(args)
    if args.e2e:
        if args.collectors < 2 or args.iterations < 1 or args.log_interval_s <= 0:
            p.error(f"--collectors: {args.collectors} (must be >= 2: one per learner) / --iterations: "
                    f"{args.iterations} (>= 1) / --log-interval-s: {args.log_interval_s} (> 0)")
        return end_to_end(args)
    if args.overrides:
        p.error(f"key=value overrides {args.overrides} only go with --e2e")

    load = os.getloadavg()[0]
    print(f"# bench_learners: device {args.device}, backend {args.backend}, nproc {os.cpu_count()} "
          f"(affinity {len(os.sched_getaffinity(0))}), load average {load:.2f} at start")
    print(f"# per learner: batch {args.batch}, critic {args.layers}x{args.critic_hidden}, actor "
          f"{args.layers}x{args.actor_hidden}, {args.atoms} atoms, obs {args.obs_dim}, act {args.act_dim}, "
          f"{args.threads} torch thread(s); {args.warmup} warm-up + {args.updates} timed updates per measurement")
    print("# samples/s ratio = 2 x updates/s(2 learners) / updates/s(1); physical bound 2.00x")
    ratios, ups = [], {1: [], 2: []}
    shares = []
    for r in range(args.rounds):
        order = (1, 2) if r % 2 == 0 else (2, 1)
        got = {w: measure(args, w) for w in order}
        for w in (1, 2):
            ups[w].append(got[w]["updates_per_s"])
        ratio = 2 * got[2]["updates_per_s"] / got[1]["updates_per_s"]
        ratios.append(ratio)
        shares.append(100 * got[2]["reduce_share"])
        print(f"round {r + 1}  1 learner {got[1]['updates_per_s']:8.1f} updates/s   2 learners "
              f"{got[2]['updates_per_s']:8.1f} updates/s   samples/s ratio {ratio:5.2f}x   all-reduce "
              f"{shares[-1]:4.1f}% of update time", flush=True)
    print(f"1 learner:  {spread(ups[1], '{:.1f}')} updates/s")
    print(f"2 learners: {spread(ups[2], '{:.1f}')} updates/s (each on its own batch of {args.batch})")
    print(f"samples/s ratio 2 vs 1 learner(s): {spread(ratios)}x (bound 2.00x); all-reduce "
          f"{spread(shares, '{:.1f}')}% of the 2 learners' update time")
    print(f"# load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
