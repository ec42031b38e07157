"""The benchmarks still run: each at its smallest size, checked for its rows, never for its numbers.

Benchmarks are not tests (speed is measured only by running them on purpose, see
docs/performance.md); this only keeps them from rotting when the code they drive changes.
"""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_bench_acceptance_rates_are_steps_over_elapsed_time():
    spec = importlib.util.spec_from_file_location("bench_acceptance", REPO / "benchmarks" / "bench_acceptance.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench       # its dataclasses look their module up
    spec.loader.exec_module(bench)
    # 512-env batches counted in 1 s and 0.5 s windows: per-window rates jump; the steps do not
    rows = [{"wall_time": t, "perf/env_steps_per_s": r} for t, r in
            [(0.0, 0), (1.0, 4096), (1.5, 5120), (2.5, 4096), (3.0, 6144), (4.0, 4608), (5.0, 5120), (6.0, 9999)]]
    # the steady part: windows ending at 1.5 .. 5.0 (not the first third, not the stop's last window)
    want = (0.5 * 5120 + 1.0 * 4096 + 0.5 * 6144 + 1.0 * 4608 + 1.0 * 5120) / 4.0
    assert bench.steady(rows, "perf/env_steps_per_s") == want


def test_bench_update_prints_both_updates_and_their_gemm_floor(capsys):
    spec = importlib.util.spec_from_file_location("bench_update", REPO / "benchmarks" / "bench_update.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--sizes", "quickstart", "--threads", "1", "2", "--rounds", "1", "--updates", "2"]) == 0
    out = capsys.readouterr().out
    assert "cpu: " in out and ("AVX" in out or "no AVX2" in out)
    rows = [line.split() for line in out.splitlines() if line.startswith("quickstart")]
    assert [(r[1], r[2]) for r in rows] == [("reference", "1"), ("fastsac", "1"), ("reference", "2"), ("fastsac", "2")]
    for r in rows:
        ms, floor_ms, gflop = float(r[3]), float(r[7]), float(r[5])
        assert ms > 0 and 0 < floor_ms and gflop > 0
    assert rows[1][5] == rows[0][5]          # the same GEMM FLOPs: the same mathematics
