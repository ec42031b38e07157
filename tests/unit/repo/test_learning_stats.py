"""The learning benchmark's arithmetic and its curves file: what a learning claim rests on."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stats = _load("learning_stats")

# (env steps, seconds, eval return): a standing initial policy scores 998 before any update
CURVE = [(8_000, 4.0, 998.0), (16_000, 60.0, -40.0), (24_000, 120.0, 700.0), (32_000, 180.0, 1_200.0)]


def test_first_reach_leaves_out_the_warm_up():
    assert stats.first_reach(CURVE, 900.0) == (8_000, 4.0)       # what counting the warm-up claims
    assert stats.first_reach(CURVE, 900.0, after_steps=10_000) == (32_000, 180.0)
    assert stats.first_reach(CURVE, 2_000.0, after_steps=10_000) == (None, None)


def test_value_at_is_the_last_evaluation_at_or_before_the_point():
    assert stats.value_at(CURVE, 24_000, "steps") == 700.0
    assert stats.value_at(CURVE, 179.9, "seconds") == 700.0
    assert stats.value_at(CURVE, 7_999, "steps") != stats.value_at(CURVE, 7_999, "steps")   # nan: none yet


def test_iqm_drops_the_outer_quarters():
    assert stats.iqm([0.0, 10.0, 20.0, 1_000.0]) == 15.0


def test_curves_file_keeps_each_runs_warm_up(tmp_path):
    bench = _load("bench_learning")
    path = tmp_path / "curves.csv"
    bench.append_curve(path, "sync", 1, CURVE, warmup_steps=10_000)
    bench.append_curve(path, "sb3", 1, CURVE[:2], warmup_steps=0)
    kinds = [line.rsplit(",", 1)[1] for line in path.read_text().splitlines()[1:]]
    assert kinds == ["untrained", "periodic", "periodic", "final", "periodic", "final"]
    curves, finished, warmups = bench.load_curves(path)
    assert curves[("sync", 1)] == CURVE and finished == {("sync", 1), ("sb3", 1)}
    assert warmups == {("sync", 1): 8_000}
