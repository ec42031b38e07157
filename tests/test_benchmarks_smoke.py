"""The benchmarks still run: each at its smallest size, checked for its rows, never for its numbers.

Benchmarks are not tests (speed is measured only by running them on purpose, see
docs/performance.md); this only keeps them from rotting when the code they drive changes.
"""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_bench_envs_measures_every_cell():
    pytest.importorskip("mujoco", reason="MuJoCo tasks need the optional extra: pip install 'fastsac[mujoco]'")
    pytest.importorskip("imageio", reason="Gymnasium's MuJoCo envs import imageio: pip install 'gymnasium[mujoco]'")
    out = run_benchmark("bench_envs.py", "--tasks", "halfcheetah", "--num-envs", "4", "--threads", "1", "2",
                        "--seconds", "0.02", "--rounds", "2", "--warmup", "1", "--with-loop")
    rows = [line.split() for line in out.splitlines() if line.startswith("halfcheetah")]
    cells = [(" ".join(r[2:4]), r[4]) for r in rows]
    assert cells == [("gymnasium sync", "1"), ("physics bound", "1"), ("fastsac batched", "1"),
                     ("fastsac batched", "2"), ("fastsac loop", "1"), ("fastsac loop", "2")], out
    assert all(r[-4] == r[-2] == "1.00x" for r in rows[:1]), out   # Gymnasium against itself
    assert all(r[-4].endswith("x") and r[-3].startswith("[") for r in rows), out


def test_bench_ring_measures_push_copy_and_snapshot():
    out = run_benchmark("bench_ring.py", "--envs", "64", "--seconds", "0.2", "--snapshot-mib", "0.1")
    assert "snapshot MiB" in out and "slots/s" in out, out
    assert not list(Path("/dev/shm").glob("fastsac.bench*")), "bench_ring left segments behind"
