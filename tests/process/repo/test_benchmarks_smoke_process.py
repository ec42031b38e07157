"""The benchmarks still run: each at its smallest size, checked for its rows, never for its numbers.

Benchmarks are not tests (speed is measured only by running them on purpose, see
docs/performance.md); this only keeps them from rotting when the code they drive changes.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROGRESS_LINE = re.compile(r"^\[\d+/\d+\] ", re.MULTILINE)   # a trainer's console progress line
# The quick start's nets at a smoke test's width: the benchmarks' rows come out the same, their
# jobs' learners update in a fraction of the time (the numbers are never checked).
SMALL_NETS = ["algo.actor_hidden_dim=16", "algo.critic_hidden_dim=16", "algo.batch_size=32"]
# No evaluator process for the benchmarks whose rows read no evaluation (every job of theirs starts one less
# process; bench_learning and bench_eval_cost measure evaluation and keep it)
NO_EVAL = "eval.interval=0"


def run_benchmark(script: str, *args: str, timeout: float = 120, env: dict | None = None) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.process
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


@pytest.mark.process
def test_bench_ring_measures_push_copy_and_snapshot():
    out = run_benchmark("bench_ring.py", "--envs", "64", "--seconds", "0.2", "--snapshot-mib", "0.1")
    assert "snapshot MiB" in out and "slots/s" in out, out
    assert not list(Path("/dev/shm").glob("fastsac.bench*")), "bench_ring left segments behind"


@pytest.mark.process
def test_bench_acceptance_prints_every_criterion_and_sums_up():
    out = run_benchmark("bench_acceptance.py", "--smoke", *SMALL_NETS, NO_EVAL, timeout=400)
    lines = out.splitlines()
    for prefix in ("round 1  1 collector", "round 1  2 collectors", "seed 1  sync", "seed 1  1 collector",
                   "seed 2  2 collectors"):
        assert any(line.startswith(prefix) for line in lines), (prefix, out)
    words = {line.split()[0] if line.startswith("perf/") else " ".join(line.split()[:3]): line.split()[-1]
             for line in lines if line.startswith(("perf/", "returns "))}
    for row in ("perf/env_steps_per_s", "perf/learn_pct", "perf/updates_per_s", "returns 1 collector",
                "returns 2 collectors"):
        assert words.get(row) in ("pass", "FAIL"), (row, out)
    assert words.get("returns sync (band)") == "(band)", out
    assert re.fullmatch(r"acceptance: [0-4] of 4 criteria met.*", lines[-1]), out
    one_node = any(line.startswith("# NOTE: one collector per NUMA node not tested") for line in lines)
    assert one_node == ("one collector per NUMA node not tested" in lines[-1]), out


@pytest.mark.process
def test_bench_acceptance_refuses_bad_input_before_running_anything():
    for args, what in ((["--collectors", "1"], "--collectors: 1"),
                       (["configs/quickstart.yaml", "env.num_envs=0"], "env.num_envs"),
                       (["env.num_envs=0"], "env.num_envs")):
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_acceptance.py"), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and what in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.process
def test_bench_collectors_scales():
    pytest.importorskip("mujoco", reason="MuJoCo tasks need the optional extra: pip install 'fastsac[mujoco]'")
    out = run_benchmark("bench_collectors.py", "--num-envs", "8", "--iterations", "200", "--log-interval", "10",
                        "--log-interval-s", "0.5", "--collectors", "1", "2", timeout=300)
    lines = out.splitlines()
    for prefix in ("1 collector(s): ", "2 collector(s): ", "scaling 2 vs 1 collector(s): ",
                   "2 collectors, collector 0 slowed 3x: per collector "):
        assert any(line.startswith(prefix) for line in lines), (prefix, out)
    assert all("updates/s, learn" in line for line in lines if "collector(s): " in line and "|" in line), out


@pytest.mark.process
def test_bench_collector_inference_measures_cost_and_learner_contention():
    out = run_benchmark("bench_collector_inference.py", "--num-envs", "16", "--collectors", "1", "2",
                        "--hidden", "32", "--seconds", "0.2", "--rounds", "1", "--learner-batch", "64",
                        "--learner-critic-hidden", "32", "--learner-actor-hidden", "32")
    lines = out.splitlines()
    assert any(line.startswith("1 collector(s) x 16 envs: CPU") for line in lines), out
    assert any(line.startswith("2 collector(s) x 8 envs: CPU") for line in lines), out
    head = next(i for i, line in enumerate(lines) if "learner upd/s (CPU inference)" in line)
    assert [line.split()[0] for line in lines[head + 1:head + 4]] == ["0", "1", "2"], out


@pytest.mark.process
def test_gpu_check_dry_run_on_cpu():
    out = run_benchmark("gpu_check.py", "--device", "cpu", "--quick", timeout=480)
    for text in ("PASS environment:", "PASS plan: learner cpu (auto → cpu: no NVIDIA GPU visible)",
                 "PASS update eager fp32:", "SKIP update compile + bf16: CUDA only",
                 "PASS staging: 4 slots ring -> pinned -> cpu: byte-equal", "PASS inference 1024 envs: cpu",
                 "PASS quick start: exit 0", "PASS resume: resume=auto: exit 0", "SKIP nccl learners",
                 "learner upd/s (CPU inference)", "PASS contention", "| check ", "all checks passed"):
        assert text in out, (text, out)


@pytest.mark.process
def test_bench_envs_measures_envpool_rows():
    pytest.importorskip("envpool", reason="EnvPool rows need the optional extra: pip install 'fastsac[envpool]'")
    out = run_benchmark("bench_envs.py", "--tasks", "--envpool-tasks", "CheetahRun-v1", "--num-envs", "4",
                        "--threads", "1", "2", "--seconds", "0.02", "--rounds", "2", "--warmup", "1",
                        "--envpool-affinity")
    import re
    rows = [re.match(r"CheetahRun-v1\s+4 (.+?)\s+(\d) .* (\S+x) \[.*\]\s+(\S+x) \[.*\]$", line)
            for line in out.splitlines() if line.startswith("CheetahRun-v1")]
    assert all(rows), out
    cells = [(m[1], m[2]) for m in rows]
    # the pinned cell exists only where this process's CPUs allow a pin (2 threads = 2 consecutive CPUs)
    assert cells[:4] == [("envpool raw", "1"), ("fastsac envpool", "1"), ("envpool raw", "2"),
                         ("fastsac envpool", "2")], out
    assert cells[4:] in ([], [("envpool raw pin", "2")]), out
    assert rows[0][3] == rows[0][4] == "1.00x", out   # raw EnvPool against itself


@pytest.mark.process
def test_bench_learners_measures_1_and_2_learners():
    out = run_benchmark("bench_learners.py", "--rounds", "1", "--updates", "3", "--warmup", "1", "--batch", "16",
                        "--critic-hidden", "16", "--actor-hidden", "16", "--atoms", "5")
    lines = out.splitlines()
    assert any(line.startswith("round 1  1 learner ") and "samples/s ratio" in line for line in lines), out
    assert any(line.startswith("samples/s ratio 2 vs 1 learner(s): ") and "(bound 2.00x)" in line
               for line in lines), out


@pytest.mark.process
def test_bench_eval_cost_pairs_eval_off_and_on():
    out = run_benchmark("bench_eval_cost.py", "--smoke", "configs/quickstart.yaml", *SMALL_NETS,
                        timeout=300)
    lines = out.splitlines()
    rows = [line.split() for line in lines if line.startswith("1 ")]
    assert rows and rows[0][1] == "off/on" and rows[0][4].endswith("x") and int(rows[0][-1]) >= 1, out
    assert any(line.startswith("learner updates/s on/off: ") and "[" in line for line in lines), out
    assert any(line.startswith("env steps/s on/off: ") for line in lines), out
    assert not list(Path("/dev/shm").glob("fastsac.bev*")), "bench_eval_cost left segments behind"


@pytest.mark.process
def test_bench_learners_end_to_end_runs_jobs_with_1_and_2_learners():
    out = run_benchmark("bench_learners.py", "--e2e", "configs/quickstart.yaml", "--rounds", "1", "--iterations", "30",
                        "--log-interval-s", "0.5", "device=cpu", "env.num_envs=8", "algo.batch_size=32",
                        "algo.critic_hidden_dim=16", "algo.actor_hidden_dim=16", "algo.learning_starts=2",
                        "algo.buffer_size=64", NO_EVAL, timeout=300)
    lines = out.splitlines()
    assert any(line.startswith("round 1  1 learner ") and " 2 learners " in line for line in lines), out
    for what in ("env-steps/s", "updates/s"):
        assert any(line.startswith(f"{what} 2 vs 1 learner(s): ") for line in lines), out


def bench_learning(out: Path, modes: list[str]) -> tuple[str, str]:
    """(stdout, summary.md) of bench_learning --smoke over modes, with its CSV and plots checked."""
    # one intra-op thread for the processes that do not size their own pools (fastsac's do): the SB3
    # peer's 500 updates of 256-wide nets take 6x longer on two threads of a busy 2-core box, same result
    stdout = run_benchmark("bench_learning.py", "--smoke", "--modes", *modes, "--seeds", "1", "--out", str(out),
                           *SMALL_NETS, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0] == "mode,seed,env_steps,seconds,mean_return,kind", rows[:2]
    assert sorted(r.split(",")[0] for r in rows[1:] if r.endswith(",final")) == sorted(modes), rows  # one each
    assert {r.split(",")[0] for r in rows[1:]} == set(modes), rows
    assert {r.rsplit(",", 1)[1] for r in rows[1:]} <= {"untrained", "periodic", "final"}, rows
    summary = (out / "summary.md").read_text()
    for mode in modes:
        assert f"{mode} seed 1: final eval return" in stdout and f"| {mode} | final | mean " in summary, stdout
    assert "IQM" in summary and "bootstrap" in summary, summary
    if importlib.util.find_spec("matplotlib"):
        assert sorted(p.name for p in out.glob("*.png")) == ["curves_seconds.png", "curves_steps.png"]
    return stdout, summary


FASTSAC_MODES = ["sync", "async1", "async2"]


@pytest.fixture(scope="module")
def learning_runs(tmp_path_factory) -> tuple[Path, str, str]:
    """(out, stdout, summary.md) of one bench_learning --smoke over every fastsac mode and, where
    Stable-Baselines3 is installed, its peer: the two tests below share its runs (one sync run, not two)."""
    out = tmp_path_factory.mktemp("bench_learning")
    peer = ["sb3"] if importlib.util.find_spec("stable_baselines3") else []
    return out, *bench_learning(out, FASTSAC_MODES + peer)


@pytest.mark.process
def test_bench_learning_reports_eval_curves_of_every_fastsac_mode(learning_runs, tmp_path):
    shared, stdout, summary = learning_runs
    for mode in FASTSAC_MODES:      # bench_learning()'s per-mode checks, made on the shared run
        assert f"{mode} seed 1: final eval return" in stdout and f"| {mode} | final | mean " in summary, stdout
    shutil.copytree(shared, tmp_path, dirs_exist_ok=True)      # the peer's test reads the shared folder as it was
    # a second run with the same --out skips every run it already holds, and gives a held run
    # without its final evaluation (a CSV from before final rows) that evaluation from its run_dir
    csv_path = tmp_path / "curves.csv"
    rows = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(r for r in rows if not r.startswith("sync,") or not r.endswith(",final")) + "\n")
    again = run_benchmark("bench_learning.py", "--smoke", "--modes", "sync", "async1", "--seeds", "1",
                          "--out", str(tmp_path), *SMALL_NETS)
    assert again.count("already, skipped") == 2 and again.count("its final evaluation: ") == 1, again
    assert csv_path.read_text().splitlines()[-1].startswith("sync,1,"), "the final row is appended"
    report = tmp_path / "report"           # --report: the table of a copied curves.csv, nothing run
    report.mkdir()
    shutil.copy(csv_path, report / "curves.csv")
    table = run_benchmark("bench_learning.py", "--report", "--modes", "sync", "async1", "--out", str(report))
    assert "| sync | final | mean " in table and "| async1 | final | mean " in table, table
    assert "budget per run: not stored in curves.csv" in table, "a report without --budget-s made one up"
    assert not (report / "runs").exists(), "a report made a runs/ folder"
    assert not list(Path("/dev/shm").glob("fastsac.bl*")), "bench_learning left segments behind"


@pytest.mark.process
def test_bench_learning_runs_its_peer(learning_runs):
    pytest.importorskip("stable_baselines3", reason="the SB3 peer needs the benchmark extra: pip install -e '.[bench]'")
    _, stdout, summary = learning_runs      # the same run as the fastsac modes' (its sync run is theirs)
    for mode in ("sync", "sb3"):
        assert f"{mode} seed 1: final eval return" in stdout and f"| {mode} | final | mean " in summary, stdout
    assert "the peer's final return" in summary and "sync: reaches it in" in summary, summary


@pytest.mark.process
def test_bench_neighbour_pairs_quiet_and_busy_runs():
    out = run_benchmark("bench_neighbour.py", "--smoke", *SMALL_NETS, NO_EVAL, timeout=180)
    assert re.search(r"^round 1 sync : quiet +[\d.]+ upd/s .*\| neighbour +[\d.]+ upd/s .*\| ratio [\d.]+x updates",
                     out, re.M), out
    assert re.search(r"^\| sync \| [\d.]+ \| [\d.]+ \| [\d.]+x \[", out, re.M), out


@pytest.mark.process
def test_bench_neighbour_quiet_only_pairs_sync_with_async():
    # 20 s: the async job's first logged window must land inside the run on a loaded 2-core box
    out = run_benchmark("bench_neighbour.py", "--quiet-only", "--rounds", "1", "--seconds", "20", "--warmup-s", "0",
                        "algo.learning_starts=2", "env.num_envs=8", NO_EVAL, timeout=180)
    assert re.search(r"^round 1 sync : +[\d.]+ upd/s", out, re.M) and re.search(r"^round 1 async: +[\d.]+ upd/s", out, re.M), out
    assert re.search(r"^async / sync updates/s: [\d.]+x \[", out, re.M), out


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.process
def test_a_stopped_benchmark_stops_the_job_it_started(tmp_path):
    # before: a benchmark ended by `timeout` left its job running (half an hour at 170% CPU);
    # async1: a launcher and its children, the harder case
    import signal
    import time
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "bench_learning.py"), "--smoke", "--modes",
                             "async1", "--seeds", "1", "--out", str(tmp_path), "trainer.num_iterations=100000"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        log = tmp_path / "runs" / "async1_s1.log"
        deadline = time.monotonic() + 120     # the job is up once its learner logs progress
        while time.monotonic() < deadline and not (log.exists() and PROGRESS_LINE.search(log.read_text())):
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)      # what `timeout` sends, to the benchmark only
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out, err)
    deadline = time.monotonic() + 10
    while _processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_naming(str(tmp_path)), "the benchmark's job outlived it"
    assert not list(Path("/dev/shm").glob(f"fastsac.bl{proc.pid % 10000}*")), "the benchmark's job left segments"
