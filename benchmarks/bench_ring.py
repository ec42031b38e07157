"""Shared-memory transport benchmark: ring throughput between two processes, next to a
plain memcpy measured in the same run, and seqlock snapshot publish/load latency.

  .venv/bin/python benchmarks/bench_ring.py                    # Humanoid dims, 1024 and 4096 envs
  .venv/bin/python benchmarks/bench_ring.py --envs 4096 --seconds 5 --capacity 16

Ring: a producer process try_push()es env-step batches copied from env-like arrays (obs,
actions, rewards, done flags, plus the final observations of the envs whose episode
ended: --final-frac of them per step); the consumer (this process) copy_out()s every
slot into dense rows plus packed final rows (what the learner does before one
host->device copy) and releases it. Bytes moved per slot = dense part + final rows.

memcpy: numpy copyto of a buffer of the same size (pre-faulted), one thread. The ring's
goal is >= 70% of it: every byte is copied twice (push, copy_out), but in two processes
on two cores at once.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fastsac import shm_layout as L  # noqa: E402
from fastsac.common.transition import TransitionBatch  # noqa: E402

INCARNATION = 0xBE7C_0000_0000_0001


def memcpy_gbps(nbytes: int, working_set: int = 1, seconds: float = 1.0) -> float:
    """numpy copyto of nbytes chunks, one thread, pre-faulted buffers.

    working_set=1 copies the same buffer over and over (cache-hot for a few MiB);
    working_set=capacity rotates through as many source/destination chunks as the ring
    and the staging buffer hold, so the baseline touches as much memory as the ring does.
    """
    src = np.ones((working_set, nbytes), np.uint8)
    dst = np.ones((working_set, nbytes), np.uint8)  # pre-faulted: bandwidth, not page faults
    np.copyto(dst, src)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        i = n % working_set
        np.copyto(dst[i], src[i])
        n += 1
    return n * nbytes / (time.perf_counter() - t0) / 1e9


def _memcpy_worker(nbytes: int, working_set: int, seconds: float, start, result) -> None:
    start.wait(30)
    result.put(memcpy_gbps(nbytes, working_set, seconds))


def memcpy_pair_gbps(nbytes: int, working_set: int, seconds: float = 1.0) -> float:
    """Aggregate GB/s of two processes copying at once (the ring's two copies run like this)."""
    ctx = mp.get_context("spawn")
    start, result = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_memcpy_worker, args=(nbytes, working_set, seconds, start, result), daemon=True)
          for _ in range(2)]
    for p in ps:
        p.start()
    time.sleep(0.5)  # let both allocate and pre-fault before the clock starts
    start.set()
    total = result.get(timeout=60) + result.get(timeout=60)
    for p in ps:
        p.join(10)
    return total


def _env_batch(spec: L.RingSpec, final_frac: float, rng: np.random.Generator) -> TransitionBatch:
    n = spec.num_envs
    nf = max(1, int(round(n * final_frac))) if final_frac > 0 else 0
    done = np.zeros(n, bool)
    done[rng.choice(n, nf, replace=False)] = True
    return TransitionBatch(
        obs=rng.standard_normal((n, spec.obs_dim), dtype=np.float32),
        critic_obs=(rng.standard_normal((n, spec.critic_obs_dim), dtype=np.float32) if spec.critic_obs_dim else None),
        actions=rng.standard_normal((n, spec.act_dim), dtype=np.float32),
        rewards=rng.standard_normal(n, dtype=np.float32),
        terminated=done.copy(), truncated=np.zeros(n, bool),
        final_idx=np.flatnonzero(done),
        final_obs=rng.standard_normal((n, spec.obs_dim), dtype=np.float32),  # full [N, dim]: gathered rows
        final_critic_obs=(rng.standard_normal((n, spec.critic_obs_dim), dtype=np.float32)
                          if spec.critic_obs_dim else None))


def _producer(job: str, spec: L.RingSpec, final_frac: float, zero_copy: bool, ready, stop, result) -> None:
    ring = L.TransitionRing.create(job, 0, spec, INCARNATION)
    batch = _env_batch(spec, final_frac, np.random.default_rng(0))
    nf = batch.num_final
    ready.set()
    pushed = full = 0
    push_s = 0.0
    while not stop.is_set():
        t = time.perf_counter()
        if zero_copy:
            # The env / policy wrote obs, actions, ... into the slot in place (not timed
            # here: it is their work); the ring only publishes it.
            slot = ring.next_free_slot()
            ok = slot is not None
            if ok:
                slot.num_final, slot.env_step = nf, pushed
                ring.commit()
        else:
            ok = ring.try_push(batch, weight_version=0, env_step=pushed, incarnation=0)
        if ok:
            push_s += time.perf_counter() - t
            pushed += 1
        else:
            full += 1
            time.sleep(0)
    result.put({"pushed": pushed, "full": full, "push_ms": 1e3 * push_s / max(pushed, 1)})
    ring.close()


def bench_ring(spec: L.RingSpec, final_frac: float, seconds: float, zero_copy: bool = False,
               warmup: float = 0.5) -> dict:
    job = f"bench{os.getpid()}"
    L.unlink_job_segments(job, force=True) if not L.job_is_alive(job) else None
    ctx = mp.get_context("spawn")
    ready, stop, result = ctx.Event(), ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_producer, args=(job, spec, final_frac, zero_copy, ready, stop, result),
                    daemon=True)
    p.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("producer did not start")
        cons = L.TransitionRing.attach(job, 0, spec, "consumer")
        k = spec.capacity
        # pre-faulted, like a pinned buffer: the learner's dense rows and packed final rows
        dense, finals = np.ones((k, spec.dense_nbytes), np.uint8), np.ones(k * spec.slot_nbytes, np.uint8)
        slots, copy_s, t0 = 0, 0.0, time.perf_counter()
        measuring = False
        while True:
            now = time.perf_counter()
            if not measuring and now - t0 >= warmup:
                measuring, slots, copy_s, t_start = True, 0, 0.0, now
            if measuring and now - t_start >= seconds:
                break
            if cons.available() == 0:
                time.sleep(0)
                continue
            t = time.perf_counter()
            n, _, _ = cons.copy_out(dense, finals, k)
            copy_s += time.perf_counter() - t
            cons.release(n)
            slots += n
        elapsed = time.perf_counter() - t_start
        stop.set()
        prod = result.get(timeout=30)
        cons.close()
    finally:
        stop.set()
        p.join(10)
        if p.is_alive():
            p.kill()
        L.unlink_job_segments(job, force=True)
    nf = max(1, int(round(spec.num_envs * final_frac))) if final_frac > 0 else 0
    row_bytes = sum(f.nbytes // spec.num_envs for f in spec.slot_fields() if f.offset >= spec.dense_nbytes)
    moved = spec.dense_nbytes + nf * row_bytes
    return {"num_envs": spec.num_envs, "slot_mib": spec.slot_nbytes / 2**20, "moved_mib": moved / 2**20,
            "slots_per_s": slots / elapsed, "env_steps_per_s": slots * spec.num_envs / elapsed,
            "gbps": slots * moved / elapsed / 1e9, "copy_out_ms": 1e3 * copy_s / max(slots, 1),
            "push_ms": prod["push_ms"], "producer_full_waits": prod["full"], "moved_bytes": moved}


def bench_seqlock(numel: int, reps: int) -> dict:
    job = f"benchw{os.getpid()}"
    reader = L.WeightSnapshot.create(job, 0, numel, INCARNATION)
    writer = L.WeightSnapshot.attach(job, 0, numel, "writer")
    try:
        flat = np.ones(numel, np.float32)
        out = np.empty(numel, np.float32)
        writer.publish(flat), reader.try_load(out, -1)  # warm
        pub, load = [], []
        for _ in range(reps):
            t = time.perf_counter()
            v = writer.publish(flat)
            pub.append(time.perf_counter() - t)
            t = time.perf_counter()
            assert reader.try_load(out, v - 1) == v
            load.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(reps):
            reader.try_load(out, v)  # nothing new: the cost of a poll
        poll = (time.perf_counter() - t) / reps
    finally:
        reader.close(), writer.close()
        L.unlink_job_segments(job, force=True)
    return {"mib": numel * 4 / 2**20, "publish_us": 1e6 * float(np.median(pub)),
            "load_us": 1e6 * float(np.median(load)), "poll_us": 1e6 * poll}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--obs", type=int, default=348, help="obs_dim (Humanoid-v5: 348)")
    ap.add_argument("--critic-obs", type=int, default=0)
    ap.add_argument("--act", type=int, default=17, help="act_dim (Humanoid-v5: 17)")
    ap.add_argument("--capacity", type=int, default=16)
    ap.add_argument("--final-frac", type=float, default=0.001,
                    help="fraction of envs whose episode ends per step (1000-step episodes: 0.001)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--snapshot-mib", type=float, nargs="+", default=[1, 4])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    results = {"machine": os.uname().machine, "cpus": os.cpu_count(), "ring": [], "seqlock": []}
    print(f"# bench_ring: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start "
          f"(shared machine: numbers are noisy)")
    big = memcpy_gbps(64 << 20, seconds=1.0)
    print(f"# plain memcpy (numpy copyto, one thread), 64 MiB buffer: {big:.2f} GB/s")
    hdr = (f"{'envs':>5} {'push':>9} {'slot MiB':>8} {'moved MiB':>9} {'slots/s':>7} {'env-steps/s':>11} "
           f"{'ring GB/s':>9} {'memcpy':>6} {'ratio':>5} {'2-proc':>6} {'ceiling':>7} {'push ms':>7} {'copy_out ms':>11} "
           f"{'2-core slots/s':>14}")
    print(hdr)
    for n in args.envs:
        spec = L.RingSpec(n, args.obs, args.critic_obs, args.act, args.capacity)
        moved = None
        for zero_copy in (False, True):
            r = bench_ring(spec, args.final_frac, args.seconds, zero_copy=zero_copy)
            if moved is None:  # baselines once per size, with the ring's chunk size and working set
                moved = r["moved_bytes"]
                ws = memcpy_gbps(moved, working_set=args.capacity)
                pair = memcpy_pair_gbps(moved, working_set=args.capacity)
            copies = 1 if zero_copy else 2  # bytes copied per byte delivered
            r.update(memcpy_ws_gbps=ws, memcpy_pair_gbps=pair, memcpy_64mib_gbps=big, zero_copy=zero_copy,
                     ratio=r["gbps"] / ws, ceiling_gbps=(pair / 2 if copies == 2 else ws))
            r["of_ceiling"] = r["gbps"] / r["ceiling_gbps"]
            # what the two measured per-slot costs allow if each process had its own idle core
            r["two_core_slots_per_s"] = 1e3 / max(r["push_ms"], r["copy_out_ms"])
            results["ring"].append(r)
            print(f"{n:>5} {'in place' if zero_copy else 'try_push':>9} {r['slot_mib']:>8.2f} {r['moved_mib']:>9.2f} "
                  f"{r['slots_per_s']:>7.0f} {r['env_steps_per_s']:>11,.0f} {r['gbps']:>9.2f} {ws:>6.2f} "
                  f"{r['ratio']:>5.0%} {pair:>6.2f} {r['of_ceiling']:>7.0%} {r['push_ms']:>7.3f} "
                  f"{r['copy_out_ms']:>11.3f} {r['two_core_slots_per_s']:>14.0f}")
    print("""# moved: bytes per slot the ring delivers (dense part + final rows of ended episodes)
# memcpy: GB/s of one thread copying same-size chunks through a ring-sized working set; ratio = ring / memcpy
# 2-proc: aggregate GB/s of two processes doing that at once. try_push copies every byte twice (push +
#   copy_out, one per process, concurrently): its ceiling is 2-proc / 2. In place (env writes into the
#   slot, next_free_slot + commit): one copy; ceiling = memcpy. ceiling column = ring / that ceiling
# in place here: the producer does not write the data, so copy_out reads cold memory (a lower bound;
#   a real env writes the slot just before, leaving it warm in the shared L3 as try_push does)
# 2-core slots/s = 1 / max(push ms, copy_out ms): the rate with one idle core per process""")
    print(f"\n{'snapshot MiB':>12} {'publish us':>10} {'load us':>8} {'poll us':>8}")
    for mib in args.snapshot_mib:
        numel = int(mib * 2**20) // 4
        s = bench_seqlock(numel, reps=200 if mib <= 1 else 50)
        results["seqlock"].append(s)
        print(f"{s['mib']:>12.0f} {s['publish_us']:>10.0f} {s['load_us']:>8.0f} {s['poll_us']:>8.2f}")
    print(f"# load average {os.getloadavg()[0]:.2f} at end")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
