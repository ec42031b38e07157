"""Checkpoint files: atomic writes, pruning, leftovers of killed writers, corrupt files."""
import os

import pytest

from fastsac.checkpoint import (CheckpointError, checkpoint_dir, load_checkpoint, newest_valid_checkpoint,
                                save_checkpoint)


def _save(run, steps, keep=3):
    return save_checkpoint(run, {"env_steps": steps, "agent": {"w": steps}, "env": {"name": "pendulum"}}, keep)


def test_prunes_to_keep_and_newest_valid_skips_corrupt(tmp_path):
    for steps in (10, 20, 30, 40):
        _save(tmp_path, steps)
    names = sorted(p.name for p in checkpoint_dir(tmp_path).glob("ckpt_*.pt"))
    assert names == ["ckpt_00000000000020.pt", "ckpt_00000000000030.pt", "ckpt_00000000000040.pt"]
    newest = checkpoint_dir(tmp_path) / names[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a crash without atomic writes
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(newest)
    skipped = []
    assert newest_valid_checkpoint(tmp_path, log=skipped.append).name == names[-2]
    assert skipped and "skipping" in skipped[0]


def test_removes_temp_files_of_dead_writers_only(tmp_path):
    d = checkpoint_dir(tmp_path)
    d.mkdir(parents=True)
    dead = d / ".tmp_ckpt_999999999_a.pt"
    live = d / f".tmp_ckpt_{os.getpid()}_b.pt"
    dead.write_text("x")
    live.write_text("x")
    _save(tmp_path, 5)
    assert not dead.exists() and live.exists()


def test_not_a_checkpoint(tmp_path):
    import torch
    p = tmp_path / "x.pt"
    torch.save({"hello": 1}, p)
    with pytest.raises(CheckpointError, match="not a fastsac checkpoint"):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
