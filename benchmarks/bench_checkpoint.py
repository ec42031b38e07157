"""Checkpoint cost: fastsac's verified save and load next to plain torch.save / torch.load of the
same payload, in paired interleaved rounds.

  .venv/bin/python benchmarks/bench_checkpoint.py                 # reference-size agent, Humanoid dims
  .venv/bin/python benchmarks/bench_checkpoint.py --rounds 7 --dir /var/lib/fastsac/runs

Cells, per round, in alternating order:
  torch    save: torch.save to a temp file + fsync + rename + directory fsync (an atomic write, no
           checksum); load: torch.load(weights_only=True)
  fastsac  save: RunCheckpoints.save (CPU copy, sha256 + finite check, the same atomic write, read
           back and verified before the rename, retention); load: load_checkpoint (torch.load,
           sha256 and finite check)
The ratio column is fastsac / torch within each round: median [min-max] over rounds. Loads read
a file just written (page cache), so they measure the CPU cost, not the disk.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fastsac.algo.fastsac import FastSAC  # noqa: E402
from fastsac.config import AlgoConfig  # noqa: E402
from fastsac.run_dir import checkpoint as ck  # noqa: E402

HUMANOID_OBS, HUMANOID_ACT = 348, 17


def build_payload(small: bool) -> dict:
    """A trained-shaped agent state: every optimizer has its Adam moments (one update taken)."""
    algo = AlgoConfig(actor_hidden_dim=32, critic_hidden_dim=32, num_atoms=21) if small else AlgoConfig()
    torch.manual_seed(0)
    agent = FastSAC(HUMANOID_OBS, 0, HUMANOID_ACT, -np.ones(HUMANOID_ACT, np.float32),
                    np.ones(HUMANOID_ACT, np.float32), algo, torch.device("cpu"))
    for opt in agent._optimizers.values():   # materialize the moments a real checkpoint carries
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"agent": agent.state_dict(), "env_steps": 123_456, "config": {"note": "bench"},
            "env": {"name": "humanoid", "obs_dim": HUMANOID_OBS, "critic_obs_dim": 0, "act_dim": HUMANOID_ACT}}


def torch_save(directory: Path, payload: dict) -> Path:
    final = directory / "plain.pt"
    fd, tmp = tempfile.mkstemp(prefix=".tmp_plain_", suffix=".pt", dir=directory)
    with os.fdopen(fd, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    dfd = os.open(directory, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return final


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def summary(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="paired rounds (>= 1)")
    p.add_argument("--small", action="store_true", help="a 32-wide agent (the smoke test's size)")
    p.add_argument("--dir", default=None, help="where the files are written (default: a temp dir in runs/)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: {args.rounds} is not >= 1")
    torch.set_num_threads(1)
    base = Path(args.dir) if args.dir else Path("runs")
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_", dir=base))
    try:
        payload = build_payload(args.small)
        numel = sum(t.numel() for t in _tensors(payload))
        print(f"# machine: {platform.machine()}, nproc {os.cpu_count()}, load average at start "
              f"{os.getloadavg()[0]:.2f}; torch {torch.__version__}, 1 thread; files in {work}")
        run = ck.RunCheckpoints.fresh(work / "run", keep=1, log=lambda m: None)
        plain_dir = work / "plain"
        plain_dir.mkdir()
        t_hash, _ = timed(ck.payload_digest, payload)
        cells = {k: [] for k in ("torch save", "fastsac save", "torch load", "fastsac load")}
        ratios = {"save": [], "load": []}
        size = 0
        for r in range(args.rounds):
            order = ("torch", "fastsac") if r % 2 == 0 else ("fastsac", "torch")
            got = {}
            for who in order:
                if who == "torch":
                    got["torch save"], path = timed(torch_save, plain_dir, payload)
                    got["torch load"], _ = timed(lambda q: torch.load(q, weights_only=True), path)
                else:
                    got["fastsac save"], path = timed(run.save, payload)
                    got["fastsac load"], _ = timed(ck.load_checkpoint, path)
                    size = path.stat().st_size
            for k, v in got.items():
                cells[k].append(v)
            ratios["save"].append(got["fastsac save"] / got["torch save"])
            ratios["load"].append(got["fastsac load"] / got["torch load"])
        print(f"# agent: {'small (32 wide)' if args.small else 'reference (AlgoConfig defaults)'}, Humanoid dims "
              f"(obs {HUMANOID_OBS}, act {HUMANOID_ACT}); {numel / 1e6:.2f} M values, file {size / 1e6:.1f} MB")
        print(f"# sha256 + finite check of the payload alone: {t_hash:.3f} s ({size / t_hash / 1e9:.2f} GB/s)")
        print(f"# {args.rounds} paired rounds; seconds and ratio: median [min-max]")
        print(f"{'op':6} {'torch s':>22} {'fastsac s':>22} {'fastsac/torch':>22}")
        for op in ("save", "load"):
            print(f"{op:6} {summary(cells['torch ' + op]):>22} {summary(cells['fastsac ' + op]):>22} "
                  f"{summary(ratios[op], '.2f') + 'x':>22}")
        print(f"# load average at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


if __name__ == "__main__":
    sys.exit(main())
