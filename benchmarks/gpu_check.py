"""GPU check: the learner's and the collectors' device paths on one CUDA machine, in a few minutes.

    python benchmarks/gpu_check.py            # everything below, ~2-4 min on one GPU
    python benchmarks/gpu_check.py --device cpu --quick   # dry run of the same code paths on a CPU

Prints, each next to its CPU-side counterpart measured in the same run:
  1. FastSAC update at the reference sizes (batch 8192, critic 768, actor 512, 101 atoms):
     eager fp32 vs bf16 autocast vs torch.compile(+bf16), ms per update;
  2. the learner's staging path: k Humanoid slots (4096 envs) host->device, pinned vs pageable, GB/s;
  3. collector policy inference on the device vs 1 CPU thread, us per env-step (1024 / 4096 envs);
  4. a short end-to-end async run of the quick start on the device (exit code, env-steps/s, updates/s);
  5. the learner's updates/s while 0, 1, 2 collectors run policy inference on their CPUs vs on
     the learner's device (benchmarks/bench_collector_inference.py --sections learner).
Copy the printed block into docs/performance.md with the machine's name. Exit code 1 when a check
failed (the end-to-end run or the contention benchmark), else 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402


def timed(fn, n: int, device: torch.device) -> float:
    """Seconds per call of fn, after 3 warm-up calls, synchronizing the device."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / n


def check_updates(device: torch.device, quick: bool) -> None:
    from fastsac.algo.fastsac import FastSAC
    from fastsac.algo.replay_buffer import ReplayBuffer
    from fastsac.common.transition import TransitionBatch
    from fastsac.config import AlgoConfig
    obs_dim, act_dim, envs = 348, 17, 1024
    batch = 1024 if quick else 8192
    for label, kw in (("eager fp32", {}), ("bf16 autocast", {"amp": True}),
                      ("compile + bf16", {"amp": True, "compile": True})):
        if device.type != "cuda" and kw:
            print(f"  update {label:16s}: skipped (CUDA only)")
            continue
        cfg = AlgoConfig(batch_size=batch, **kw)
        agent = FastSAC(obs_dim, 0, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32), cfg, device)
        buf = ReplayBuffer(envs, 32, obs_dim, 0, act_dim, 1, cfg.gamma, device)
        for _ in range(8):
            t = torch.zeros(envs, dtype=torch.bool, device=device)
            buf.extend(slice(0, envs), TransitionBatch(
                torch.randn(envs, obs_dim, device=device), None, torch.rand(envs, act_dim, device=device) * 2 - 1,
                torch.randn(envs, device=device), t, t, torch.zeros(0, dtype=torch.long, device=device),
                torch.zeros(0, obs_dim, device=device), None))
        t0 = time.perf_counter()
        agent.train(buf, cfg.policy_frequency)  # compiles here when asked
        first = time.perf_counter() - t0
        per = timed(lambda: agent.train(buf, 1), 5 if quick else 50, device)
        print(f"  update {label:16s}: {per * 1e3:8.2f} ms per update (batch {batch}); first call {first:.1f} s")


def check_staging(device: torch.device, quick: bool) -> None:
    from fastsac.shm_layout import RingSpec
    spec = RingSpec(num_envs=4096, obs_dim=348, critic_obs_dim=0, act_dim=17, capacity=16)
    k = 4
    nbytes = spec.dense_nbytes  # what a drain moves per slot (finals aside)
    for pinned in (True, False):
        if pinned and device.type != "cuda":
            continue
        host = torch.empty((k, spec.slot_nbytes), dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty((k, spec.slot_nbytes), dtype=torch.uint8, device=device)
        per = timed(lambda: dev.copy_(host, non_blocking=pinned), 3 if quick else 20, device)
        print(f"  staging {'pinned' if pinned else 'pageable':9s}: {k} slots x {nbytes / 2**20:.1f} MiB dense "
              f"({spec.slot_nbytes / 2**20:.1f} MiB with the final-obs area) in {per * 1e3:.2f} ms = "
              f"{k * spec.slot_nbytes / per / 1e9:.1f} GB/s")


def check_inference(device: torch.device, quick: bool) -> None:
    from fastsac.algo.policy import InferencePolicy
    from fastsac.config import AlgoConfig
    torch.set_num_threads(1)
    for n in (1024, 4096):
        obs = np.random.default_rng(0).standard_normal((n, 348)).astype(np.float32)
        row = []
        for dev in ([torch.device("cpu"), device] if device.type == "cuda" else [torch.device("cpu")]):
            policy = InferencePolicy(348, 17, -np.ones(17, np.float32), np.ones(17, np.float32), AlgoConfig(), dev)
            per = timed(lambda: policy.act(obs), 3 if quick else 20, dev)
            row.append(f"{dev.type} {per / n * 1e6:6.2f} us/env-step")
        print(f"  inference {n} envs: " + " | ".join(row))


def check_end_to_end(device: torch.device, quick: bool) -> bool:
    with tempfile.TemporaryDirectory(prefix="fastsac_gpu_check_") as tmp:
        cmd = [sys.executable, "-m", "fastsac.launcher", str(REPO / "configs" / "quickstart.yaml"),
               f"device={device}", "trainer.async_options.collector_inference_device=auto",
               f"trainer.num_iterations={50 if quick else 1500}", f"run_dir={tmp}/run",
               f"job_name=gpucheck{os.getpid()}", "logging.interval_s=1"]   # unique: a concurrent smoke test
        t0 = time.perf_counter()
        proc = CHILDREN.run(cmd, timeout=600)
        wall = time.perf_counter() - t0
        rates = ""
        if proc.returncode == 0:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
            acc = EventAccumulator(f"{tmp}/run/tb", size_guidance={"scalars": 0})
            acc.Reload()
            # median over the log windows; the last window (written while the run ends) is left out
            med = {t: float(np.median([e.value for e in acc.Scalars(t)][:-1] or [e.value for e in acc.Scalars(t)]))
                   for t in ("perf/env_steps_per_s", "perf/updates_per_s", "perf/learn_pct")}
            rates = (f"; median over log windows: {med['perf/env_steps_per_s']:,.0f} env-steps/s, "
                     f"{med['perf/updates_per_s']:.1f} updates/s, learn {med['perf/learn_pct']:.0f}%")
        print(f"  async quick start on {device}: exit {proc.returncode} in {wall:.0f} s{rates}")
        if proc.returncode:
            print(proc.stdout[-2000:] + proc.stderr[-2000:])
        return proc.returncode == 0


def check_learner_contention(device: torch.device, quick: bool) -> bool:
    sizes = ["--seconds", "1", "--rounds", "1"] if quick else ["--seconds", "3", "--rounds", "3"]
    if device.type != "cuda":   # the CPU dry run: small learner, few envs
        sizes += ["--num-envs", "256", "--learner-batch", "256", "--learner-critic-hidden", "128",
                  "--learner-actor-hidden", "128"]
    proc = CHILDREN.run([sys.executable, str(REPO / "benchmarks" / "bench_collector_inference.py"),
                         "--sections", "learner", "--collectors", "1", "2", "--learner-device", str(device), *sizes],
                        timeout=600)
    for line in proc.stdout.splitlines():
        print(f"  {line}")
    if proc.returncode:
        print(f"  exit {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.returncode == 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer repetitions and a smaller batch")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available here; use --device cpu for a dry run")
        return 1
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_check on {name}, torch {torch.__version__}")
    failed = []
    for check in (check_updates, check_staging, check_inference, check_end_to_end, check_learner_contention):
        print(f"{check.__name__}:", flush=True)
        if check(device, args.quick) is False:
            failed.append(check.__name__)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
