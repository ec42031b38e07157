"""Collector policy-inference cost: N collectors x CPU inference vs N x CUDA inference.

Each of N worker processes plays one collector: it owns num_envs / N envs and
`--threads` CPU threads, and times `InferencePolicy.act` on its batch for `--seconds`.
All N run at once (as collectors do). With CUDA available, the same is measured with the
policy on the GPU while another process keeps the GPU busy with learner-sized matmuls
(the contention a real learner causes). Prints microseconds per env-step and the
CPU/CUDA ratio per N: the measurement behind the default collector_inference_device.

    python benchmarks/bench_collector_inference.py --num-envs 4096 --collectors 1 2 --obs-dim 348 --act-dim 17
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time


def worker(device: str, n_envs: int, obs_dim: int, act_dim: int, hidden: int, threads: int, seconds: float,
           start, out):
    import numpy as np
    import torch

    torch.set_num_threads(threads)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=1024, help="total envs, split across collectors")
    p.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--obs-dim", type=int, default=348)
    p.add_argument("--act-dim", type=int, default=17)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per collector")
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    import torch
    cuda = torch.cuda.is_available()
    print(f"actor {args.obs_dim}->3x{args.hidden}->{args.act_dim}, {args.num_envs} envs in all, "
          f"{args.threads} CPU thread(s) per collector, CUDA {'available' if cuda else 'not available'}")
    for n in args.collectors:
        cpu = measure("cpu", n, args)
        line = f"{n} collector(s) x {args.num_envs // n} envs: CPU {cpu:7.2f} us/env-step"
        if cuda:
            gpu = measure("cuda", n, args)
            line += f" | CUDA (with learner load) {gpu:7.2f} us/env-step | CPU/CUDA {cpu / gpu:.2f}x"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
