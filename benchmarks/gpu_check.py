"""GPU check: the one command for a new GPU machine. Every CUDA path of fastsac in < 8 minutes,
a pass/fail table at the end, exit 1 when any row failed.

    python benchmarks/gpu_check.py                         # on the GPU machine (~5-7 min on one GPU)
    python benchmarks/gpu_check.py --device cpu --quick    # dry run of the same code on a CPU

Rows (each PASS / FAIL / SKIP with its numbers; CUDA-only rows SKIP on the CPU):
  environment      torch, CUDA, driver, every GPU's name, compute capability and free memory
  plan             `fastsac-launch --plan` of the quick start: concrete devices, collectors on the
                   learner's GPU, CUDA_DEVICE_ORDER (and exit 2, not a CPU plan, when torch cannot
                   use the GPU)
  update *         FastSAC's update at the reference sizes (batch 8192, critic 768, actor 512, 101
                   atoms) eager fp32 / bf16 / compiled + bf16, ms per update and which path ran
  bench_update *   benchmarks/bench_update.py (the learner's update benchmark): eager / compiled /
                   compiled with CUDA graphs, each row with the path that really ran
  staging          IngestStaging itself: real ring slots -> pinned buffer -> device, byte-equal, GB/s
  inference        collector policy inference on the device vs 1 CPU thread, us per env-step
  quick start      the async quick start on the device: exit code, env-steps/s, updates/s
  compile + amp    the same with algo.compile=true algo.amp=true (the compile fallback is a FAIL)
  resume           save -> resume=auto round trip on the device
  cuda:1, nccl     with 2+ GPUs: a learner on cuda:1, and two NCCL learners
  contention       the learner's updates/s while 0, 1, 2 collectors infer on their CPUs vs on the
                   learner's GPU (benchmarks/bench_collector_inference.py --sections learner):
                   the numbers that decide whether N collectors default to CPU inference
Copy the table into docs/performance.md ("GPU and 2-node servers") with the GPU's name.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_group import CHILDREN  # noqa: E402

BENCH_UPDATE = REPO / "benchmarks" / "bench_update.py"   # the lead's update benchmark (issue 45)
QUICKSTART = REPO / "configs" / "quickstart.yaml"
BUDGET_S = 480          # the whole check; each subprocess gets what is left, at most its own limit


@dataclass
class Row:
    name: str
    status: str        # PASS, FAIL, SKIP
    detail: str


class Check:
    def __init__(self, device: torch.device, quick: bool):
        self.device, self.quick, self.cuda = device, quick, device.type == "cuda"
        self.rows: list[Row] = []
        self.t0 = time.monotonic()

    def add(self, name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append(Row(name, status, detail))
        print(f"  {status:4s} {name}: {detail}", flush=True)

    def left(self, cap: float) -> float:
        return max(10.0, min(cap, BUDGET_S - (time.monotonic() - self.t0)))

    def run(self, cmd: list[str], cap: float):
        return CHILDREN.run(cmd, timeout=self.left(cap))


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


# --------------------------------------------------------------------------- the rows

def check_environment(c: Check) -> None:
    from fastsac.machine import devices as dv
    base = f"torch {torch.__version__}, CUDA {torch.version.cuda}, driver {dv.driver_version() or '-'}"
    if not c.cuda:
        c.add("environment", True, f"{base}; CPU dry run")
        return
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        major, minor = torch.cuda.get_device_capability(i)
        gpus.append(f"cuda:{i} {torch.cuda.get_device_name(i)} (cc {major}.{minor}, {free / 2**30:.0f}/"
                    f"{total / 2**30:.0f} GiB free)")
    c.add("environment", bool(gpus), f"{base}; " + "; ".join(gpus))


def check_plan(c: Check) -> None:
    proc = c.run([sys.executable, "-m", "fastsac.launcher", str(QUICKSTART), "--plan", "--json",
                  "trainer.async_options.num_collectors=2", "run_dir=/tmp/fastsac_gpu_check_plan"], 120)
    if proc.returncode:
        c.add("plan", False, f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return
    plan = json.loads(proc.stdout)
    learner, cols = plan["learner"], plan["collectors"]
    want = "cuda:0" if c.cuda else "cpu"
    ok = learner["device"] == want and all(x["device"] == want for x in cols) and \
        all(x["env"].get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" for x in [learner, *cols])
    c.add("plan", ok, f"learner {learner['device']} ({learner['device_reason']}); collectors "
                      f"{', '.join(x['device'] for x in cols)}; learner CPUs {learner['cpulist'] or '-'}")


def _update_agent(device: torch.device, batch: int, **kw):
    from fastsac.algo.fastsac import FastSAC
    from fastsac.algo.replay_buffer import ReplayBuffer
    from fastsac.common.transition import TransitionBatch
    from fastsac.config import AlgoConfig
    obs_dim, act_dim, envs = 348, 17, 1024
    cfg = AlgoConfig(batch_size=batch, **kw)
    agent = FastSAC(obs_dim, 0, act_dim, -np.ones(act_dim, np.float32), np.ones(act_dim, np.float32), cfg, device)
    buf = ReplayBuffer(envs, 32, obs_dim, 0, act_dim, 1, cfg.gamma, device)
    for _ in range(8):
        t = torch.zeros(envs, dtype=torch.bool, device=device)
        buf.extend(slice(0, envs), TransitionBatch(
            torch.randn(envs, obs_dim, device=device), None, torch.rand(envs, act_dim, device=device) * 2 - 1,
            torch.randn(envs, device=device), t, t, torch.zeros(0, dtype=torch.long, device=device),
            torch.zeros(0, obs_dim, device=device), None))
    return agent, buf, cfg


def check_updates(c: Check) -> None:
    batch = 1024 if c.quick else 8192
    for label, kw in (("eager fp32", {}), ("bf16 autocast", {"amp": True}),
                      ("compile + bf16", {"amp": True, "compile": True})):
        if not c.cuda and kw:
            c.add(f"update {label}", None, "CUDA only")
            continue
        agent, buf, cfg = _update_agent(c.device, batch, **kw)
        t0 = time.perf_counter()
        agent.train(buf, cfg.policy_frequency)  # compiles here when asked
        first = time.perf_counter() - t0
        per = timed(lambda: agent.train(buf, 1), 5 if c.quick else 50, c.device)
        fallback = getattr(agent, "compile_fallback_reason", None)
        path = ("eager: compile FELL BACK: " + str(fallback)[:120]) if fallback else \
            ("compiled" if agent.compiled else "eager")
        c.add(f"update {label}", not (kw.get("compile") and fallback),
              f"{per * 1e3:.2f} ms per update (batch {batch}), first call {first:.1f} s, path {path}")


def check_bench_update(c: Check) -> None:
    """HOOK for benchmarks/bench_update.py (issue 45, the lead's): expected interface
    `bench_update.py --device DEV --mode {eager,compile,cudagraphs} [--quick] --json`, one JSON line
    {"mode", "ms_per_update", "path"} where path is the path that really ran ('eager' after a
    compile fallback). A row FAILs when it exits non-zero or ran another path than asked for."""
    if not BENCH_UPDATE.exists():
        c.add("bench_update", None, f"{BENCH_UPDATE.name} is not in this checkout yet")
        return
    for mode in ("eager", "compile", "cudagraphs"):
        if not c.cuda and mode != "eager":
            c.add(f"bench_update {mode}", None, "CUDA only")
            continue
        proc = c.run([sys.executable, str(BENCH_UPDATE), "--device", str(c.device), "--mode", mode, "--json",
                      *(["--quick"] if c.quick else [])], 240)
        try:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            c.add(f"bench_update {mode}", False, f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            continue
        want = "eager" if mode == "eager" else "compiled"
        c.add(f"bench_update {mode}", proc.returncode == 0 and str(row.get("path", "")).startswith(want),
              f"{row.get('ms_per_update', float('nan')):.2f} ms per update, path {row.get('path')}")


def check_staging(c: Check) -> None:
    """Real ring slots -> IngestStaging's pinned buffer -> the device: the staged device bytes equal
    the pinned bytes, and the slot views on the device hold exactly the observations pushed."""
    from fastsac import shm_layout as shm
    from fastsac.common.transition import TransitionBatch
    from fastsac.learner.feed import CollectorFeed
    from fastsac.learner.staging import IngestStaging
    job, k = f"gpuchk{os.getpid()}", 4
    spec = shm.RingSpec(num_envs=256 if c.quick else 4096, obs_dim=348, critic_obs_dim=0, act_dim=17, capacity=8)
    ring = shm.TransitionRing.create(job, 0, spec, 1)
    snapshot = shm.WeightSnapshot.create(job, 0, 8, 1)
    feed = CollectorFeed(job, 0, 0, spec.num_envs, spec, 8)
    try:
        if not feed.try_attach(collector_incarnation=1):
            raise RuntimeError("the learner's feed could not attach the ring")
        rng = np.random.default_rng(0)
        n, pushed = spec.num_envs, []
        for step in range(k):
            obs = rng.standard_normal((n, 348)).astype(np.float32)
            pushed.append(obs)
            ring.try_push(TransitionBatch(obs, None, np.zeros((n, 17), np.float32), np.zeros(n, np.float32),
                                          np.zeros(n, bool), np.zeros(n, bool), np.zeros(0, np.int64),
                                          np.zeros((0, 348), np.float32)), 0, step + 1, 1)
        staging = IngestStaging([spec], k, c.device)
        staging.begin()
        run = staging.take(feed, k)
        used, t0 = staging.used, time.perf_counter()
        staging.send()
        if c.cuda:
            staging.copy_done.synchronize()
        dt = time.perf_counter() - t0
        same = torch.equal(staging.dev[:used].cpu(), staging.host[:used]) and all(
            torch.equal(s.obs.cpu(), torch.from_numpy(o)) for s, o in zip(staging.slots(run), pushed))
        rate = f"{used / dt / 1e9:.1f} GB/s" if c.cuda else "no copy on the CPU"
        c.add("staging", same, f"{run.k} slots ring -> pinned -> {c.device}: {'byte-equal' if same else 'BYTES DIFFER'}, "
                               f"{used / 2**20:.1f} MiB in {dt * 1e3:.2f} ms ({rate})")
    finally:
        feed.close()
        ring.close()
        snapshot.close()
        shm.cleanup.unlink_job_segments(job, force=True)


def check_inference(c: Check) -> None:
    from fastsac.algo.policy import InferencePolicy
    from fastsac.config import AlgoConfig
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in (1024, 4096):
            obs = np.random.default_rng(0).standard_normal((n, 348)).astype(np.float32)
            row = []
            for dev in ([torch.device("cpu"), c.device] if c.cuda else [torch.device("cpu")]):
                policy = InferencePolicy(348, 17, -np.ones(17, np.float32), np.ones(17, np.float32), AlgoConfig(),
                                         dev)
                per = timed(lambda: policy.act(obs), 3 if c.quick else 20, dev)
                row.append(f"{dev.type} {per / n * 1e6:.2f} us/env-step")
            c.add(f"inference {n} envs", True, " | ".join(row))
    finally:
        torch.set_num_threads(threads)


def _medians(run_dir: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(f"{run_dir}/tb", size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for t in ("perf/env_steps_per_s", "perf/updates_per_s", "perf/learn_pct", "train/update_compiled"):
        if t in acc.Tags().get("scalars", []):
            # median over the log windows; the last window (written while the run ends) is left out
            vals = [e.value for e in acc.Scalars(t)]
            out[t] = float(np.median(vals[:-1] or vals))
    text = (f"{out.get('perf/env_steps_per_s', 0):,.0f} env-steps/s, {out.get('perf/updates_per_s', 0):.1f} "
            f"updates/s, learn {out.get('perf/learn_pct', 0):.0f}%")
    if "train/update_compiled" in out:
        text += ", path " + ("compiled" if out["train/update_compiled"] >= 1 else "EAGER (compile fell back)")
    return text


def quick_start(c: Check, name: str, *overrides: str, run_dir: str, iterations: int, cap: float = 150,
                expect: str = "") -> bool:
    cmd = [sys.executable, "-m", "fastsac.launcher", str(QUICKSTART), f"trainer.num_iterations={iterations}",
           f"run_dir={run_dir}", f"job_name=gpuchk{os.getpid()}", "logging.interval_s=1", *overrides]
    t0 = time.perf_counter()
    proc = c.run(cmd, cap)
    wall = time.perf_counter() - t0
    log = Path(run_dir) / "logs" / "learner.log"
    said = [x for x in (log.read_text() if log.exists() else "").splitlines() if expect in x]
    ok = proc.returncode == 0 and bool(said)
    detail = f"exit {proc.returncode} in {wall:.0f} s"
    if proc.returncode == 0 and expect:
        detail += "; " + (said[-1].split("] ", 1)[-1].split(" (")[0].split("/")[-1][:160] if said else
                          f"no '{expect}' in {log}")
    elif proc.returncode == 0:
        detail += "; " + _medians(run_dir)
        ok = ok and "EAGER" not in detail
    else:
        detail += ": " + (proc.stderr.strip() or proc.stdout.strip())[-300:]
    c.add(name, ok, detail)
    return ok


def check_runs(c: Check, tmp: str) -> None:
    dev, n = str(c.device), 50 if c.quick else 1000
    quick_start(c, "quick start", f"device={dev}", run_dir=f"{tmp}/qs", iterations=n)
    if c.cuda:
        quick_start(c, "compile + amp", f"device={dev}", "algo.compile=true", "algo.amp=true",
                    run_dir=f"{tmp}/compiled", iterations=n, cap=240)
    else:
        c.add("compile + amp", None, "CUDA only")
    # save -> resume=auto: the second run starts at the first one's env steps and goes on
    first = quick_start(c, "resume: first run", f"device={dev}", "checkpoint.interval=10", run_dir=f"{tmp}/rs",
                        iterations=20 if c.quick else 200)
    if first:
        quick_start(c, "resume: resume=auto", f"device={dev}", "resume=auto", run_dir=f"{tmp}/rs",
                    iterations=40 if c.quick else 400, expect="resume: loaded")
    gpus = torch.cuda.device_count() if c.cuda else 0
    if gpus < 2:
        c.add("cuda:1 learner", None, f"{gpus} GPU(s): needs 2")
        c.add("nccl learners", None, f"{gpus} GPU(s): needs 2")
        return
    quick_start(c, "cuda:1 learner", "device=cuda:1", run_dir=f"{tmp}/cuda1", iterations=n)
    quick_start(c, "nccl learners", "distributed.num_learners=2", "trainer.async_options.num_collectors=2",
                "distributed.backend=nccl", run_dir=f"{tmp}/nccl", iterations=n, cap=180)


def check_learner_contention(c: Check) -> None:
    sizes = ["--seconds", "1", "--rounds", "1"] if c.quick else ["--seconds", "3", "--rounds", "3"]
    if not c.cuda:   # the CPU dry run: small learner, few envs
        sizes += ["--num-envs", "256", "--learner-batch", "256", "--learner-critic-hidden", "128",
                  "--learner-actor-hidden", "128"]
    proc = c.run([sys.executable, str(REPO / "benchmarks" / "bench_collector_inference.py"), "--sections", "learner",
                  "--collectors", "1", "2", "--learner-device", str(c.device), *sizes], 150)
    lines = [x.strip() for x in proc.stdout.splitlines() if x.strip()]
    for line in lines:
        print(f"       {line}")
    rows = [x for x in lines if x.split()[0].isdigit()]   # collectors | learner upd/s | vs 0 | us/env-step
    c.add("contention", proc.returncode == 0, "; ".join(" ".join(r.split()[:3]) for r in rows) + " (collectors, "
          "learner upd/s, vs 0 collectors; table above)" if proc.returncode == 0 else
          f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")


def table(rows: list[Row], title: str) -> str:
    w = max(len(r.name) for r in rows)
    out = [title, "", f"| {'check'.ljust(w)} | result | detail |", f"|{'-' * (w + 2)}|--------|--------|"]
    out += [f"| {r.name.ljust(w)} | {r.status:6s} | {r.detail} |" for r in rows]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, a smaller batch, shorter runs")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"CUDA is not available to torch {torch.__version__} here; use --device cpu for a dry run")
        return 1
    if device.type == "cuda":
        torch.cuda.set_device(device)
    c = Check(device, args.quick)
    name = torch.cuda.get_device_name(device) if c.cuda else "cpu (dry run)"
    print(f"gpu_check on {name}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fastsac_gpu_check_") as tmp:
        for check in (check_environment, check_plan, check_updates, check_bench_update, check_staging,
                      check_inference, lambda c: check_runs(c, tmp), check_learner_contention):
            try:
                check(c)
            except Exception as exc:  # noqa: BLE001 - a crashed check is a failed row, the others still run
                c.add(getattr(check, "__name__", "check"), False, f"{type(exc).__name__}: {exc}"[:300])
    wall = time.monotonic() - c.t0
    failed = [r.name for r in c.rows if r.status == "FAIL"]
    print()
    print(table(c.rows, f"gpu_check: {name}, torch {torch.__version__}, {wall:.0f} s"))
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} ({wall:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
