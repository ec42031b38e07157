"""The learner's update alone: fastsac's update against the update as it was (reference_update.py),
in paired interleaved rounds, next to the GEMM floor of the same update measured in the same run.

  .venv/bin/python benchmarks/bench_update.py                          # CPU recipes, all CPUs
  .venv/bin/python benchmarks/bench_update.py --sizes halfcheetah_cpu --threads 1 2 --rounds 9
  .venv/bin/python benchmarks/bench_update.py --sizes humanoid --rounds 3 --updates 2   # reference GPU sizes
  .venv/bin/python benchmarks/bench_update.py --profile                 # + the top ops of each update
  .venv/bin/python benchmarks/bench_update.py --neighbour               # beside a busy loop on the last CPU

A size is a shipped config (configs/<size>.yaml): its networks, atoms, batch and policy_frequency,
with the observation and action sizes of its env. Each round times `--updates` updates of one
implementation, then of the other (the order alternates), from pre-sampled batches; the ratio of
their times is taken round by round (median and range). Both run with `--threads` CPUs: the
reference with that many intra-op threads, fastsac's update with agent.set_threads.

GEMM floor: every matrix product of `policy_frequency` updates of an implementation (recorded with
a dispatch mode: shapes and strides), replayed alone as torch.mm on fresh operands, per update:
the time of these FLOPs with nothing else, best of two ways on `--threads` CPUs (all intra-op
threads on one sequence; or, with 2+ CPUs, the two twins' products on two threads of half each).
"of floor" = floor / measured time: 100% is the physical bound for that implementation's GEMMs.

--device DEV --mode {eager,compile,cudagraphs} [--json] [--quick]: fastsac's update alone on DEV
(the reference GPU sizes, configs/humanoid.yaml; --quick: the quick start's), eager, with
torch.compile (algo.compile) or compiled with CUDA graphs (inductor's cudagraphs, as mode
"reduce-overhead"); it prints the path that really ran (eager after a compile fallback) and,
with --json, one JSON line {"mode", "ms_per_update", "path", "device", "size"} last
(benchmarks/gpu_check.py reads it).

--neighbour: a Python busy loop pinned to the last allowed CPU runs through the timed rounds (a
shared machine, or a collector stepping beside the learner); the floor stays a quiet one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from fastsac.algo.fastsac import FastSAC  # noqa: E402
from fastsac.config import load_config  # noqa: E402
from fastsac.envs.registry import make_env  # noqa: E402
from process_group import CHILDREN  # noqa: E402
from reference_update import ReferenceUpdate  # noqa: E402

CPU_RECIPES = ["halfcheetah_cpu", "ant_cpu", "dmc_cheetah_run_cpu"]
GEMM_OPS = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"}
NUM_BATCHES = 4
# a neighbour that the scheduler shares the CPU with (SCHED_OTHER even when this runs under chrt)
SPINNER = ("import os, sys\nos.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\n"
           "os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n")


def cpu_description() -> str:
    """Model, family/model numbers and the vector extensions that decide GEMM speed."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    flags = set(info.get("flags", "").split())
    ext = [name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag in flags]
    return (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}), {' / '.join(ext) or 'no AVX2'}; {os.cpu_count()} CPUs visible")


class Size:
    """One named size: the config's agent settings and its env's dimensions."""

    def __init__(self, name: str):
        self.name = name
        self.cfg = load_config(REPO / "configs" / f"{name}.yaml", ["device=cpu"])
        env = make_env(self.cfg.env.name, 1, seed=0)
        self.obs_dim, self.critic_obs_dim, self.act_dim = env.obs_dim, env.critic_obs_dim, env.act_dim
        self.low, self.high = env.action_low, env.action_high
        env.close()

    def agent(self, seed: int = 0) -> FastSAC:
        torch.manual_seed(seed)
        agent = FastSAC(self.obs_dim, self.critic_obs_dim, self.act_dim, self.low, self.high, self.cfg.algo,
                        torch.device("cpu"))
        g = torch.Generator().manual_seed(seed)
        agent.update_normalizers(torch.randn(1024, self.obs_dim, generator=g),
                                 torch.randn(1024, self.critic_obs_dim, generator=g) if self.critic_obs_dim else None)
        return agent

    def batches(self, seed: int = 1) -> list[dict]:
        n, g = self.cfg.algo.batch_size, torch.Generator().manual_seed(seed)
        low, high = torch.as_tensor(self.low), torch.as_tensor(self.high)
        out = []
        for _ in range(NUM_BATCHES):
            b = {"obs": torch.randn(n, self.obs_dim, generator=g),
                 "next_obs": torch.randn(n, self.obs_dim, generator=g),
                 "actions": low + torch.rand(n, self.act_dim, generator=g) * (high - low),
                 "rewards": torch.randn(n, generator=g), "discount": torch.full((n,), self.cfg.algo.gamma),
                 "bootstrap": torch.ones(n), "critic_obs": None, "next_critic_obs": None}
            if self.critic_obs_dim:
                b["critic_obs"] = torch.randn(n, self.critic_obs_dim, generator=g)
                b["next_critic_obs"] = torch.randn(n, self.critic_obs_dim, generator=g)
            out.append(b)
        return out


class Impl:
    """An update to time: fastsac's (agent.update) or the reference (ReferenceUpdate.update)."""

    def __init__(self, name: str, size: Size, threads: int):
        self.name, self.threads = name, threads
        self.agent = size.agent()
        self.reference = ReferenceUpdate(self.agent) if name == "reference" else None
        self.batches, self.i = size.batches(), 0
        self.frequency = size.cfg.algo.policy_frequency

    def prepare(self) -> None:
        """This implementation's thread setting (the other one may have changed torch's)."""
        if self.reference is None:
            self.agent.set_threads(self.threads)
        else:
            torch.set_num_threads(self.threads)

    def step(self) -> None:
        batch = self.batches[self.i % NUM_BATCHES]
        self.i += 1
        (self.reference.update if self.reference is not None else self.agent.update)(batch)

    def timed(self, updates: int) -> float:
        """Seconds per update over `updates` updates (a multiple of policy_frequency)."""
        self.prepare()
        t0 = time.perf_counter()
        for _ in range(updates):
            self.step()
        return (time.perf_counter() - t0) / updates

    def close(self) -> None:
        self.agent.close()


class GemmRecorder(TorchDispatchMode):
    """Every matrix product's operands (shape, stride) and the thread that ran it."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[tuple[tuple, tuple]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in GEMM_OPS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            operands = tensors[1:3] if name in ("aten.addmm", "aten.baddbmm") else tensors[:2]
            self.calls.append((name, [(tuple(t.shape), tuple(t.stride())) for t in operands]))
        return func(*args, **(kwargs or {}))


def record_gemms(impl: Impl) -> list[list[tuple[tuple, tuple]]]:
    """The products of policy_frequency updates, run sequentially (the mode sees the calling thread)."""
    if impl.reference is None:
        impl.agent.set_threads(1)
    with GemmRecorder() as rec:
        for _ in range(impl.frequency):
            impl.step()
    return [ops for _, ops in rec.calls]


def gemm_flop(calls) -> float:
    flop = 0.0
    for (a_shape, _), (b_shape, _) in calls:
        flop += 2.0 * float(np.prod(a_shape)) * b_shape[-1]
    return flop


def gemm_floor_s(calls, threads: int, frequency: int, rounds: int = 5) -> float:
    """Seconds per update of these products alone: best of one sequence on `threads` intra-op
    threads and (threads >= 2) two halves of the sequence on two threads of threads // 2."""
    operands = [[torch.empty_strided(s, st).normal_() for s, st in ops] for ops in calls]

    def run(part) -> None:
        for a, b in part:
            torch.matmul(a, b)

    def one_sequence() -> float:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        run(operands)
        return time.perf_counter() - t0

    best = min(one_sequence() for _ in range(rounds + 1))
    if threads >= 2:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(torch.set_num_threads, threads // 2).result()
            torch.set_num_threads(threads // 2)
            halves = operands[0::2], operands[1::2]

            def two_threads() -> float:
                t0 = time.perf_counter()
                other = pool.submit(run, halves[1])
                run(halves[0])
                other.result()
                return time.perf_counter() - t0

            best = min(best, min(two_threads() for _ in range(rounds + 1)))
    torch.set_num_threads(threads)
    return best / frequency


def profile_top(impl: Impl, updates: int, top: int = 12) -> str:
    from torch.profiler import profile
    impl.prepare()
    with profile() as prof:
        for _ in range(updates):
            impl.step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def bench_size(size: Size, threads: int, rounds: int, updates: int, profile: bool,
               neighbour: bool = False) -> list[dict]:
    impls = [Impl("reference", size, threads), Impl("fastsac", size, threads)]
    updates = max(updates // impls[0].frequency, 1) * impls[0].frequency
    rows = []
    try:
        floors = {}
        for impl in impls:
            calls = record_gemms(impl)
            floors[impl.name] = (gemm_flop(calls) / impl.frequency, gemm_floor_s(calls, threads, impl.frequency))
        for impl in impls:           # warm-up: allocator, first-call paths, the worker thread
            impl.timed(impl.frequency)
        times = {impl.name: [] for impl in impls}
        spinner = CHILDREN.start([sys.executable, "-c", SPINNER, str(max(os.sched_getaffinity(0)))], cwd=REPO) \
            if neighbour else None
        try:
            for r in range(rounds):
                for impl in (impls if r % 2 == 0 else impls[::-1]):
                    times[impl.name].append(impl.timed(updates))
        finally:
            if spinner is not None:
                CHILDREN.stop(spinner, signal.SIGKILL, 5.0)
        ratios = [ref / new for ref, new in zip(times["reference"], times["fastsac"])]
        for impl in impls:
            t = statistics.median(times[impl.name])
            flop, floor = floors[impl.name]
            row = dict(size=size.name, impl=impl.name, threads=threads, ms=t * 1e3, ups=1.0 / t, gflop=flop / 1e9,
                       floor_ms=floor * 1e3, of_floor=floor / t, gflops=flop / t / 1e9)
            if impl.name == "fastsac":
                row.update(ratio=statistics.median(ratios), ratio_lo=min(ratios), ratio_hi=max(ratios))
            rows.append(row)
        if profile:
            for impl in impls:
                print(f"\n-- {size.name}, {impl.name}, {threads} thread(s): top ops of {updates} updates\n"
                      f"{profile_top(impl, updates)}")
    finally:
        for impl in impls:
            impl.close()
    return rows


def device_run(name: str, device: str, mode: str, updates: int) -> dict:
    """fastsac's update on `device` in `mode`, after warm-up (compilation included there)."""
    size = Size(name)
    size.cfg.algo.compile = mode != "eager"
    if mode == "cudagraphs":
        import torch._inductor.config as inductor_config
        inductor_config.triton.cudagraphs = True
    torch.manual_seed(0)
    agent = FastSAC(size.obs_dim, size.critic_obs_dim, size.act_dim, size.low, size.high, size.cfg.algo,
                    torch.device(device))
    batches = [{k: (v.to(device) if v is not None else None) for k, v in b.items()} for b in size.batches()]
    sync = torch.cuda.synchronize if agent.device.type == "cuda" else (lambda: None)
    for i in range(2 * size.cfg.algo.policy_frequency):       # warm-up: compiles the critic and the actor step
        agent.update(batches[i % NUM_BATCHES])
    sync()
    t0 = time.perf_counter()
    for i in range(updates):
        agent.update(batches[i % NUM_BATCHES])
    sync()
    ms = (time.perf_counter() - t0) / updates * 1e3
    if not agent.compiled or agent.compile_fallback_reason is not None:
        reason = agent.compile_fallback_reason
        path = "eager" if reason is None else f"eager (fallback: {reason})"
    else:
        path = "compiled+cudagraphs" if mode == "cudagraphs" else "compiled"
    agent.close()
    return {"mode": mode, "ms_per_update": ms, "path": path, "device": str(agent.device), "size": name}


def format_row(r: dict) -> str:
    vs = f"{r['ratio']:.2f}x [{r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}]" if "ratio" in r else "1.00x"
    return (f"{r['size']:<20} {r['impl']:<10} {r['threads']:>3} {r['ms']:>10.2f} {r['ups']:>10.1f} {r['gflop']:>7.3f} "
            f"{r['gflops']:>8.1f} {r['floor_ms']:>9.2f} {r['of_floor']:>8.0%}   {vs}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=CPU_RECIPES, help="config names (configs/<name>.yaml)")
    ap.add_argument("--threads", nargs="+", type=int, default=[len(os.sched_getaffinity(0))])
    ap.add_argument("--rounds", type=int, default=7, help="paired rounds (the order alternates)")
    ap.add_argument("--updates", type=int, default=40, help="updates per implementation per round")
    ap.add_argument("--profile", action="store_true", help="print the top ops of each update (torch profiler)")
    ap.add_argument("--neighbour", action="store_true", help="a busy loop on the last CPU during the rounds")
    ap.add_argument("--device", help="fastsac's update alone on this device (cpu, cuda, cuda:N)")
    ap.add_argument("--mode", choices=["eager", "compile", "cudagraphs"], default="eager")
    ap.add_argument("--json", action="store_true", help="with --device: one JSON line last")
    ap.add_argument("--quick", action="store_true", help="with --device: the quick start's sizes, a few updates")
    args = ap.parse_args(argv)
    if args.device:
        row = device_run("quickstart" if args.quick else "humanoid", args.device, args.mode,
                         4 if args.quick else args.updates)
        print(f"{row['size']} on {row['device']}, {row['mode']}: {row['ms_per_update']:.2f} ms per update, "
              f"path {row['path']}")
        if args.json:
            print(json.dumps(row))
        return 0
    print(f"cpu: {cpu_description()}\ntorch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} kernels, "
          f"python {platform.python_version()}; {args.rounds} paired rounds of {args.updates} updates"
          f"{', beside a busy loop on the last CPU' if args.neighbour else ''}")
    print(f"{'size':<20} {'impl':<10} {'thr':>3} {'ms/update':>10} {'updates/s':>10} {'GFLOP':>7} {'GFLOP/s':>8} "
          f"{'floor ms':>9} {'of floor':>8}   vs reference (median [range])")
    for name in args.sizes:
        size = Size(name)
        for threads in args.threads:
            for row in bench_size(size, threads, args.rounds, args.updates, args.profile, args.neighbour):
                print(format_row(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
