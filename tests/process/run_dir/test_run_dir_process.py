"""One lineage per run_dir through the real CLI (fastsac.run_dir.contents, fastsac.training.telemetry): a
killed run's metrics are no place for a fresh run, a checkpoint of another run is no start for
this run_dir, a crash and `resume=auto` leave metrics.jsonl and TensorBoard without repeated or
backward steps, and a finished run resumed writes nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.e2e_helpers import job_segments, launch, scalar_tags, tiny_config

from fastsac.run_dir.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[3]


def tree(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def ckpts(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("ckpt_*.pt"))


def kill_after(cfg: Path, *overrides: str, when) -> None:
    """Start the synchronous trainer and SIGKILL it (a crash: nothing runs on the way out) once
    `when(run_dir)` holds."""
    proc = subprocess.Popen([sys.executable, "-m", "fastsac.launcher", str(cfg), *overrides], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not when(cfg.parent / "run"):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the crash"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def progress_steps(run: Path) -> list[int]:
    return [r["env_steps"] for r in rows(run) if "perf/updates_per_s" in r]


@pytest.mark.process
def test_a_fresh_run_into_the_run_dir_of_a_run_killed_before_its_first_checkpoint_is_refused(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 100_000},
                      checkpoint={"interval": 0})
    run = tmp_path / "run"
    kill_after(cfg, when=lambda r: (r / "metrics.jsonl").exists() and len(progress_steps(r)) >= 2)
    assert not ckpts(run)
    before = tree(run)
    proc = launch(cfg, "trainer.num_iterations=8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for needed in ("metrics.jsonl", "tb/", "resume=auto", "new run_dir"):
        assert needed in proc.stderr, (needed, proc.stderr)
    assert tree(run) == before and job_segments(job_name) == []


@pytest.mark.process
def test_resume_from_another_runs_checkpoint_is_refused_naming_both_runs(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 4})
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        assert launch(cfg, f"run_dir={run}").returncode == 0
    a_file = ckpts(a)[-1]
    a_id, b_id = load_checkpoint(a_file)["run_id"], load_checkpoint(ckpts(b)[-1])["run_id"]
    before = tree(b)
    for mode in ("false", "true"):
        proc = launch(cfg, f"run_dir={b}", f"resume={a_file}", "trainer.num_iterations=8",
                      f"trainer.asynchronous={mode}")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        for needed in (a_id, b_id, "new run_dir", "resume=auto"):
            assert needed in proc.stderr, (needed, proc.stderr)
        assert tree(b) == before and job_segments(job_name) == []
    # the way out: run a goes on in a run_dir of its own
    proc = launch(cfg, f"run_dir={tmp_path / 'a2'}", f"resume={a_file}", "trainer.num_iterations=8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_checkpoint(ckpts(tmp_path / "a2")[-1])["run_id"] == a_id


@pytest.mark.process
def test_metrics_and_tensorboard_rewind_to_the_checkpoint_after_a_crash_and_resume_auto(tmp_path, job_name):
    """Rows logged after the last checkpoint are dropped when resume=auto continues from it, so
    env_steps never repeats or goes backwards; every row names its run and incarnation."""
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 100_000},
                      checkpoint={"interval": 6})
    run = tmp_path / "run"
    past = lambda r: ckpts(r) and max(progress_steps(r), default=0) > 6 * 8 + 2 * 8   # rows past the checkpoint
    kill_after(cfg, when=past)
    at = max(load_checkpoint(p)["env_steps"] for p in ckpts(run))
    assert max(progress_steps(run)) > at
    proc = launch(cfg, "resume=auto", f"trainer.num_iterations={at // 8 + 8}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = progress_steps(run)
    assert steps == sorted(set(steps)), steps
    run_id = load_checkpoint(ckpts(run)[-1])["run_id"]
    assert {(r["run_id"], r["incarnation"]) for r in rows(run)} == {(run_id, 1), (run_id, 2)}
    assert all(r["env_steps"] <= at for r in rows(run) if r["incarnation"] == 1)
    tb = scalar_tags(run)["perf/updates_per_s"]
    assert len(tb) == len(steps), (len(tb), steps)      # TensorBoard purged the crashed start's later points


@pytest.mark.process
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resuming_a_finished_run_writes_nothing_and_says_so(tmp_path, job_name, mode):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": mode == "async", "num_iterations": 12},
                      checkpoint={"interval": 6, "keep": 2})
    run = tmp_path / "run"
    assert launch(cfg).returncode == 0
    before = tree(run / "checkpoints"), rows(run)
    for budget in (12, 12, 6):      # two no-op restarts, then a budget below the steps done
        proc = launch(cfg, "resume=auto", f"trainer.num_iterations={budget}")
        out = proc.stdout + proc.stderr + ((run / "logs" / "learner.log").read_text() if mode == "async" else "")
        assert proc.returncode == 0, out
        assert "nothing to do: the checkpoint resumed from is at env step 96" in out, out
        if budget == 6:
            assert "the budget is smaller than the env steps already done" in out, out
        assert (tree(run / "checkpoints"), rows(run)) == before
    assert job_segments(job_name) == []
