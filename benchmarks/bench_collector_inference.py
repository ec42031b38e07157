"""Collector policy inference: its cost per env-step, and what it does to the learner.

1. Cost: each of N worker processes plays one collector: it owns num_envs / N envs and
   `--threads` CPU threads, and times `InferencePolicy.act` on its batch for `--seconds`.
   All N run at once (as collectors do). With CUDA available, the same is measured with the
   policy on the GPU while another process keeps the GPU busy with learner-sized matmuls
   (the contention a real learner causes). Prints microseconds per env-step and the
   CPU/CUDA ratio per N: the measurement behind the default collector_inference_device.
2. The learner's side: one process runs real FastSAC updates (agent.train on a filled replay
   buffer) on the learner's device (CUDA when present, else CPU) while 0..N collector
   processes run policy inference on their CPUs, or on the learner's device. N collectors
   doing CUDA inference compete with the learner for the GPU; on their own CPUs they do not.
   Cells (0 collectors; k collectors x CPU / CUDA inference) are measured in --rounds
   interleaved rounds of --seconds each, the workers staying up and switching mode between
   cells; prints the learner's updates/s (median over rounds) and, against 0 collectors, the
   median [range] of the round-by-round ratios. The learner is pinned to the first CPU and the
   collectors to the others (round robin) when there are several.

    python benchmarks/bench_collector_inference.py --num-envs 4096 --collectors 1 2 --obs-dim 348 --act-dim 17
    python benchmarks/bench_collector_inference.py --sections learner --collectors 1 2 --rounds 5
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

from fastsac.process.torch_runtime import configure_torch

IDLE, ON_CPU, ON_DEVICE = 0, 1, 2   # what a contention worker does (a shared value the controller sets)
SETTLE_S = 0.3                       # after a mode switch, before a cell's window opens


def worker(device: str, n_envs: int, obs_dim: int, act_dim: int, hidden: int, threads: int, seconds: float,
           start, out):
    import numpy as np

    configure_torch(threads)   # the settings of a real collector / learner process
    from fastsac.algo.policy import InferencePolicy
    from fastsac.config import AlgoConfig
    cfg = AlgoConfig(actor_hidden_dim=hidden)
    policy = InferencePolicy(obs_dim, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32), cfg,
                             device)
    obs = np.random.default_rng(0).standard_normal((n_envs, obs_dim)).astype(np.float32)
    for _ in range(5):
        policy.act(obs)
    start.wait()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        policy.act(obs)  # returns numpy: includes the device->host copy a collector needs
        calls += 1
    out.put((time.perf_counter() - t0) / calls / n_envs * 1e6)


def gpu_load(stop):
    import torch
    a = torch.randn(8192, 768, device="cuda")
    w = torch.randn(768, 768, device="cuda")
    while not stop.is_set():
        for _ in range(50):
            a = torch.nn.functional.silu(a @ w) * 0.01
        torch.cuda.synchronize()


def measure(device: str, n: int, args) -> float:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(n), ctx.Queue()
    stop = ctx.Event()
    load = ctx.Process(target=gpu_load, args=(stop,)) if device == "cuda" else None
    if load:
        load.start()
    procs = [ctx.Process(target=worker, args=(device, args.num_envs // n, args.obs_dim, args.act_dim, args.hidden,
                                              args.threads, args.seconds, start, out)) for _ in range(n)]
    for p in procs:
        p.start()
    per_env = [out.get() for _ in procs]
    for p in procs:
        p.join()
    if load:
        stop.set()
        load.join()
    return sum(per_env) / len(per_env)


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _policy(obs_dim: int, act_dim: int, hidden: int, device: str):
    import numpy as np
    from fastsac.algo.policy import InferencePolicy
    from fastsac.config import AlgoConfig
    return InferencePolicy(obs_dim, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32),
                           AlgoConfig(actor_hidden_dim=hidden), device)


def learner_worker(device: str, cpu: int | None, threads: int, obs_dim: int, act_dim: int, batch: int,
                   critic_hidden: int, actor_hidden: int, updates, ready, stop) -> None:
    """Real FastSAC updates, back to back, counting each finished one in `updates`."""
    _pin(cpu)
    import numpy as np
    import torch
    configure_torch(threads)   # the settings of a real collector / learner process
    from fastsac.algo.fastsac import FastSAC
    from fastsac.algo.replay_buffer import ReplayBuffer
    from fastsac.common.transition import TransitionBatch
    from fastsac.config import AlgoConfig
    dev = torch.device(device)
    cfg = AlgoConfig(batch_size=batch, critic_hidden_dim=critic_hidden, actor_hidden_dim=actor_hidden)
    agent = FastSAC(obs_dim, 0, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32), cfg, dev)
    envs = max(64, batch // 8)
    buf = ReplayBuffer(envs, 16, obs_dim, 0, act_dim, 1, cfg.gamma, dev)
    for _ in range(8):
        t = torch.zeros(envs, dtype=torch.bool, device=dev)
        buf.extend(slice(0, envs), TransitionBatch(
            torch.randn(envs, obs_dim, device=dev), None, torch.rand(envs, act_dim, device=dev) * 2 - 1,
            torch.randn(envs, device=dev), t, t, torch.zeros(0, dtype=torch.long, device=dev),
            torch.zeros(0, obs_dim, device=dev), None))
    agent.train(buf, cfg.policy_frequency)   # first calls (allocations) outside any window
    ready.set()
    while not stop.is_set():
        agent.train(buf, 1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        updates.value += 1


def inference_worker(device: str, cpu: int | None, threads: int, n_envs: int, obs_dim: int, act_dim: int,
                     hidden: int, mode, calls, ready, stop) -> None:
    """A collector's inference loop, switched between idle / its CPU / the learner's device."""
    _pin(cpu)
    import numpy as np
    configure_torch(threads)   # the settings of a real collector / learner process
    policies = {ON_CPU: _policy(obs_dim, act_dim, hidden, "cpu")}
    if device != "cpu":
        policies[ON_DEVICE] = _policy(obs_dim, act_dim, hidden, device)
    obs = np.random.default_rng(0).standard_normal((n_envs, obs_dim)).astype(np.float32)
    for policy in policies.values():
        for _ in range(3):
            policy.act(obs)
    ready.set()
    while not stop.is_set():
        m = mode.value
        if m == IDLE:
            time.sleep(0.002)
            continue
        policies[m].act(obs)   # numpy out: includes the device->host copy a collector needs
        calls.value += 1


def _ratio(values: list[float], base: list[float]) -> str:
    r = [v / b for v, b in zip(values, base) if b > 0]
    return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]" if r else "n/a"


def learner_contention(args, device: str) -> None:
    """Learner updates/s with 0..N collectors doing inference on their CPUs vs on the learner's device."""
    ctx = mp.get_context("spawn")
    n_max = max(args.collectors)
    cpus = sorted(os.sched_getaffinity(0))
    learner_cpu = cpus[0] if len(cpus) > 1 else None
    worker_cpus = [cpus[1 + i % (len(cpus) - 1)] if len(cpus) > 1 else None for i in range(n_max)]
    n_envs = args.num_envs // n_max
    stop = ctx.Event()
    updates = ctx.Value("q", 0, lock=False)
    ready = [ctx.Event() for _ in range(n_max + 1)]
    modes = [ctx.Value("i", IDLE, lock=False) for _ in range(n_max)]
    calls = [ctx.Value("q", 0, lock=False) for _ in range(n_max)]
    procs = [ctx.Process(target=learner_worker, args=(device, learner_cpu, args.learner_threads, args.obs_dim,
                                                      args.act_dim, args.learner_batch, args.learner_critic_hidden,
                                                      args.learner_actor_hidden, updates, ready[0], stop))]
    procs += [ctx.Process(target=inference_worker, args=(device, worker_cpus[i], args.threads, n_envs, args.obs_dim,
                                                         args.act_dim, args.hidden, modes[i], calls[i], ready[i + 1],
                                                         stop)) for i in range(n_max)]
    on = ["cpu"] + ([device] if device != "cpu" else [])
    cells = [(0, None)] + [(k, where) for k in sorted(set(args.collectors)) for where in on]
    ups = {c: [] for c in cells}
    us = {c: [] for c in cells}
    print(f"\nlearner: FastSAC updates on {device} (batch {args.learner_batch}, critic {args.learner_critic_hidden}, "
          f"actor {args.learner_actor_hidden}, {args.learner_threads} thread(s)"
          f"{f', CPU {learner_cpu}' if learner_cpu is not None else ''}); collectors: {n_envs} envs each, "
          f"CPUs {', '.join(str(c) for c in worker_cpus) if learner_cpu is not None else 'shared'}; "
          f"{args.rounds} interleaved rounds of {args.seconds:g} s per cell", flush=True)
    for p in procs:
        p.start()
    try:
        for ev in ready:
            if not ev.wait(600):
                raise SystemExit("a contention worker did not start within 600 s")
        for _ in range(args.rounds):
            for k, where in cells:
                for i, m in enumerate(modes):
                    m.value = IDLE if i >= k else (ON_CPU if where == "cpu" else ON_DEVICE)
                time.sleep(SETTLE_S)
                u0, c0, t0 = updates.value, [c.value for c in calls], time.perf_counter()
                time.sleep(args.seconds)
                u1, c1, dt = updates.value, [c.value for c in calls], time.perf_counter() - t0
                ups[(k, where)].append((u1 - u0) / dt)
                done = [b - a for a, b in zip(c0[:k], c1[:k])]
                if k and all(done):
                    us[(k, where)].append(statistics.fmean(dt / d / n_envs * 1e6 for d in done))
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    base = ups[(0, None)]
    header = f"{'collectors':>10}  " + "  ".join(
        f"{'learner upd/s (' + ('CPU' if w == 'cpu' else w) + ' inference)':>32} {'vs 0 collectors':>20} "
        f"{'us/env-step':>11}" for w in on)
    print(header)
    print(f"{0:>10}  {statistics.median(base):>32.2f} {'1.00x':>20} {'-':>11}")
    for k in sorted(set(args.collectors)):
        cols = []
        for w in on:
            v, u = ups[(k, w)], us[(k, w)]
            cols.append(f"{statistics.median(v):>32.2f} {_ratio(v, base):>20} "
                        f"{(f'{statistics.median(u):.2f}' if u else 'n/a'):>11}")
        print(f"{k:>10}  " + "  ".join(cols), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", choices=["inference", "learner"], default=["inference", "learner"],
                   help="inference: us/env-step CPU vs CUDA; learner: learner updates/s with 0..N collectors")
    p.add_argument("--num-envs", type=int, default=1024, help="total envs, split across collectors")
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--obs-dim", type=int, default=348)
    p.add_argument("--act-dim", type=int, default=17)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per collector")
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement (inference) or cell and round (learner)")
    p.add_argument("--rounds", type=int, default=3, help="learner section: interleaved rounds")
    p.add_argument("--learner-device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--learner-batch", type=int, default=None, help="default: 8192 on CUDA, 512 on CPU")
    p.add_argument("--learner-critic-hidden", type=int, default=None, help="default: 768 on CUDA, 256 on CPU")
    p.add_argument("--learner-actor-hidden", type=int, default=None, help="default: 512 on CUDA, 256 on CPU")
    p.add_argument("--learner-threads", type=int, default=1, help="torch threads of the learner process")
    args = p.parse_args()
    for name in ("num_envs", "obs_dim", "act_dim", "hidden", "threads", "seconds", "rounds", "learner_threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is not valid; expected a positive value")
    if min(args.collectors) < 1 or max(args.collectors) > args.num_envs:
        p.error(f"--collectors: {args.collectors} is not valid; expected 1..{args.num_envs} (--num-envs)")
    import torch
    cuda = torch.cuda.is_available()
    device = args.learner_device or ("cuda" if cuda else "cpu")
    if device.startswith("cuda") and not cuda:
        p.error(f"--learner-device: {device!r} but CUDA is not available; use cpu")
    big = device.startswith("cuda")
    args.learner_batch = args.learner_batch or (8192 if big else 512)
    args.learner_critic_hidden = args.learner_critic_hidden or (768 if big else 256)
    args.learner_actor_hidden = args.learner_actor_hidden or (512 if big else 256)
    print(f"actor {args.obs_dim}->3x{args.hidden}->{args.act_dim}, {args.num_envs} envs in all, "
          f"{args.threads} CPU thread(s) per collector, CUDA {'available' if cuda else 'not available'}")
    if "inference" in args.sections:
        for n in args.collectors:
            cpu = measure("cpu", n, args)
            line = f"{n} collector(s) x {args.num_envs // n} envs: CPU {cpu:7.2f} us/env-step"
            if cuda:
                gpu = measure("cuda", n, args)
                line += f" | CUDA (with learner load) {gpu:7.2f} us/env-step | CPU/CUDA {cpu / gpu:.2f}x"
            print(line, flush=True)
    if "learner" in args.sections:
        learner_contention(args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
