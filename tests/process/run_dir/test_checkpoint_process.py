"""Checkpoint files: atomic verified writes, retention by run and write order, leftovers of killed
writers, corrupt and foreign files (tests/unit/training/test_checkpoint_integrity.py drives the trainers' save/restore)."""
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.process
def test_bench_checkpoint_smoke(tmp_path):
    """benchmarks/bench_checkpoint.py still runs at its smallest size (rows checked, never numbers)."""
    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_checkpoint.py"
    proc = subprocess.run([sys.executable, str(bench), "--small", "--rounds", "1", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert rows == ["op", "save", "load"], proc.stdout
    assert list(tmp_path.iterdir()) == [], "the benchmark left files behind"
