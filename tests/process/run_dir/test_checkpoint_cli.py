"""Checkpoint faults through the real CLI (CPU, real processes and files): a fresh run into a used
run_dir, a checkpoint corrupted in place, a full or failing disk during periodic and final saves.

Disk faults are injected into the process that trains (the learner, or the launcher running the
synchronous trainer) by tests/support/fault_hooks/sitecustomize.py (FASTSAC_TEST_SAVE_FAIL).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.checkpoint_bytes import flip_tensor_bytes
from support.e2e_helpers import job_segments, launch, tiny_config

from fastsac.run_dir.checkpoint import CheckpointError, load_checkpoint

HOOKS_DIR = Path(__file__).resolve().parents[2] / "support" / "fault_hooks"
MODES = ["sync", "async"]


def hooks_env(**extra: str) -> dict:
    path = os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def asynchronous(mode: str) -> str:
    return f"trainer.asynchronous={'true' if mode == 'async' else 'false'}"


def ckpts(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob("ckpt_*.pt"))


def by_write_order(run: Path) -> list[tuple[Path, dict]]:
    """Every valid checkpoint with its payload, oldest write first."""
    loaded = []
    for p in ckpts(run):
        try:
            loaded.append((p, load_checkpoint(p)))
        except CheckpointError:
            pass
    return sorted(loaded, key=lambda pl: (pl[1].get("save_seq", 0), pl[1]["saved_at"]))


def tree(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def output(proc, run: Path) -> str:
    learner = run / "logs" / "learner.log"
    return proc.stdout + proc.stderr + (learner.read_text(errors="replace") if learner.exists() else "")


def no_temp_files(run: Path) -> bool:
    return not [p for p in (run / "checkpoints").iterdir() if not p.name.startswith("ckpt_")]


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_fresh_run_into_a_run_dir_with_another_runs_checkpoints_is_refused(tmp_path, job_name, mode):
    # the reported defect: a 12-iteration run, then a 4-iteration fresh run into the same run_dir
    # with keep=1 deleted its own checkpoints, the final one included
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 12})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    before, theirs = tree(run), ckpts(run)
    proc = launch(cfg, asynchronous(mode), "trainer.num_iterations=4", "checkpoint.keep=1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for needed in (str(run), theirs[-1].name, "resume=auto", "resume=<path>", "run_dir"):
        assert needed in proc.stderr, (needed, proc.stderr)
    assert tree(run) == before and job_segments(job_name) == []          # nothing created or touched
    # way out 1: continue that run (its run id, so keep=1 prunes its older files)
    run_id = load_checkpoint(theirs[-1])["run_id"]
    proc = launch(cfg, asynchronous(mode), "trainer.num_iterations=16", "checkpoint.keep=1", "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [(_, payload)] = by_write_order(run)
    assert payload["env_steps"] == 16 * 8 and payload["run_id"] == run_id
    if mode == "sync":   # way out 2: a new run_dir (a fresh run id); the refusal is the same in both modes
        proc = launch(cfg, "trainer.num_iterations=4", f"run_dir={tmp_path / 'run2'}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert load_checkpoint(ckpts(tmp_path / "run2")[-1])["run_id"] != run_id
    assert job_segments(job_name) == []


@pytest.mark.process
def test_plan_and_check_numa_read_a_run_dir_with_checkpoints(tmp_path, job_name):
    # read-only commands train nothing: an earlier run's checkpoints are no reason to refuse them,
    # while the training launch is refused naming the run id it found
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 12})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    before, run_id = tree(run / "checkpoints"), load_checkpoint(ckpts(run)[-1])["run_id"]
    for args in (["--plan"], ["--plan", "--json"], ["--check-numa", asynchronous("async")]):
        proc = launch(cfg, *args)
        assert proc.returncode == 0, (args, proc.stdout + proc.stderr)
    refused = launch(cfg)
    assert refused.returncode == 2 and f"run id {run_id}" in refused.stderr, refused.stderr
    assert tree(run / "checkpoints") == before and job_segments(job_name) == []   # (the check's reports go to logs/)


@pytest.mark.process
def test_resume_auto_reports_a_corrupt_checkpoint_and_falls_back_without_a_crash_loop(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 12})
    assert launch(cfg).returncode == 0                      # periodic at 48 env steps, final at 96
    run = tmp_path / "run"
    (older, _), (newest, _) = by_write_order(run)
    flip_tensor_bytes(newest, 4)
    corrupt = newest.read_bytes()
    proc = launch(cfg, "trainer.asynchronous=true", "trainer.num_iterations=18", "resume=auto")
    out = output(proc, run)
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert [line for line in out.splitlines() if str(newest) in line and "checksum" in line], out
    assert f"resume: loaded {older} at env step 48" in out, out
    # restarted again (as systemd does): it goes on from the newest valid one, no crash loop
    proc = launch(cfg, "trainer.asynchronous=false", "trainer.num_iterations=20", "resume=auto")
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "at env step 144" in proc.stdout, proc.stdout
    assert newest.read_bytes() == corrupt                   # reported, never deleted or rewritten
    assert by_write_order(run)[-1][1]["env_steps"] == 20 * 8


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_a_full_disk_on_a_periodic_save_is_logged_and_retried_at_the_next_interval(tmp_path, job_name, mode):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": mode == "async", "num_iterations": 20},
                      checkpoint={"interval": 4, "keep": 10}, logging={"tensorboard": False})
    proc = launch(cfg, env=hooks_env(FASTSAC_TEST_SAVE_FAIL="ENOSPC:1"))     # the first save fails
    run = tmp_path / "run"
    out = output(proc, run)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    failed = [line for line in out.splitlines() if "No space left on device" in line]
    assert failed and "not saved" in failed[0] and "previous checkpoints are kept" in failed[0], out
    saved = [p["env_steps"] for _, p in by_write_order(run)]
    assert saved[-1] == 20 * 8 and len(saved) >= 3, saved   # later periodic saves and the final one
    assert min(saved) >= 8 * 8, saved                        # the first interval's save is the one lost
    assert no_temp_files(run)
    assert job_segments(job_name) == []


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_a_failed_final_save_exits_1_with_the_reason_and_keeps_the_previous(tmp_path, job_name, mode):
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 6},
                      checkpoint={"interval": 0}, logging={"tensorboard": False})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    [previous] = ckpts(run)
    kept = previous.read_bytes()
    proc = launch(cfg, asynchronous(mode), "trainer.num_iterations=10", "resume=auto",
                  env=hooks_env(FASTSAC_TEST_SAVE_FAIL="EIO:all"))
    out = output(proc, run)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    reason = [line for line in out.splitlines() if "final checkpoint" in line and "Input/output error" in line]
    assert reason, out
    assert ckpts(run) == [previous] and previous.read_bytes() == kept
    assert no_temp_files(run)
    assert job_segments(job_name) == []


@pytest.mark.process
@pytest.mark.parametrize("mode", MODES)
def test_resume_with_other_network_sizes_names_the_keys_and_both_values(tmp_path, job_name, mode):
    # before: PyTorch's list of mismatched tensor shapes (the learner's: a traceback-sized dump)
    cfg = tiny_config(tmp_path, job_name, trainer={"asynchronous": False, "num_iterations": 4})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    before = tree(run / "checkpoints")
    proc = launch(cfg, asynchronous(mode), "resume=auto", "trainer.num_iterations=8", "algo.critic_hidden_dim=48",
                  "algo.num_atoms=11")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = output(proc, run)
    for needed in ("algo.critic_hidden_dim: 32 in the checkpoint, 48 in this job",
                   "algo.num_atoms: 21 in the checkpoint, 11 in this job", "start a fresh run in another run_dir"):
        assert needed in text, (needed, text)
    assert "size mismatch" not in text and "Traceback" not in text, text
    assert tree(run / "checkpoints") == before and job_segments(job_name) == []
