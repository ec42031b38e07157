"""Checkpoints lose nothing: run identity and write order drive retention, a checksum catches
corruption, non-finite states are refused, failed saves keep what was there.

These drive the real save/restore of both trainers (fastsac.training.state) on a small FastSAC
agent in one process; tests/process/run_dir/test_checkpoint_cli.py runs the same faults through the CLI.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from support.checkpoint_bytes import tensor_records
from fastsac.config import load_config
from fastsac.envs.registry import EnvSpec
from fastsac.run_dir import checkpoint as ck
from fastsac.run_dir import contents as run_dir
from fastsac.run_dir.checkpoint import CheckpointError, checkpoint_dir, load_checkpoint, newest_valid
from fastsac.training import state as run_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = EnvSpec(obs_dim=3, critic_obs_dim=0, act_dim=1, max_episode_steps=200)


def make(run: Path, *overrides: str):
    """A config for run_dir=run and a small agent (critic layers of 128x128: 64 KiB records)."""
    cfg = load_config(None, [f"run_dir={run}", "device=cpu", "env.num_envs=4", "algo.actor_hidden_dim=32",
                             "algo.critic_hidden_dim=128", "algo.actor_num_layers=2", "algo.critic_num_layers=2",
                             "algo.num_atoms=21", "algo.buffer_size=4", *overrides])
    agent, _ = run_state.build_agent(cfg, SPEC, np.array([-2.0], np.float32), np.array([2.0], np.float32),
                                        torch.device("cpu"))
    return cfg, agent


def start(run: Path, *overrides: str, log=None):
    """What both trainers do at start-up: build the agent, then restore (fresh or resume)."""
    cfg, agent = make(run, *overrides)
    logged: list[str] = []
    steps = run_state.restore(cfg, SPEC, agent, log=logged.append if log is None else log)
    return cfg, agent, steps, logged


def ckpts(run: Path) -> list[Path]:
    return sorted(checkpoint_dir(run).glob("ckpt_*.pt"))


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# --------------------------------------------------------------------------- retention

def test_a_fresh_run_never_deletes_its_own_checkpoint_for_another_runs_higher_step(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    other = run_state.save(cfg, SPEC, agent, 32_000)           # an earlier, longer run
    cfg, agent, _, _ = start(tmp_path, "checkpoint.keep=1")       # a new run (fresh start)
    mine = run_state.save(cfg, SPEC, agent, 200)
    assert mine.exists() and load_checkpoint(mine)["env_steps"] == 200   # the one the log reports
    assert other.exists()                                          # another run's file: never touched
    assert load_checkpoint(mine)["run_id"] != load_checkpoint(other)["run_id"]


def test_retention_goes_by_write_order_never_by_env_step(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    first = [run_state.save(cfg, SPEC, agent, s) for s in (100, 200, 300)]
    # resume from the oldest: the new saves are newer by write order than the 300 file
    cfg, agent, steps, _ = start(tmp_path, f"resume={first[0]}", "checkpoint.keep=2")
    assert steps == 100
    a = run_state.save(cfg, SPEC, agent, 150)
    assert a.exists() and first[2].exists()
    assert not first[0].exists() and not first[1].exists()
    b = run_state.save(cfg, SPEC, agent, 250)
    assert {p.name for p in ckpts(tmp_path)} == {a.name, b.name}
    ids = {load_checkpoint(p)["run_id"] for p in (a, b)}
    assert len(ids) == 1, "a resumed run continues the run id of the checkpoint it resumed from"


def test_resumed_run_writing_at_the_same_env_step_gets_its_own_file(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    before = run_state.save(cfg, SPEC, agent, 160)
    cfg, agent, steps, _ = start(tmp_path, "resume=auto")
    assert steps == 160
    again = run_state.save(cfg, SPEC, agent, 160)      # e.g. a stop during start-up: the same env step
    assert again != before and before.exists() and again.exists()
    assert load_checkpoint(again)["save_seq"] > load_checkpoint(before)["save_seq"]


def test_truncated_newest_with_keep_1_and_resume_auto_keeps_a_valid_checkpoint(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    old = run_state.save(cfg, SPEC, agent, 100)
    newest = run_state.save(cfg, SPEC, agent, 200)
    newest.write_bytes(newest.read_bytes()[:1000])
    cfg, agent, steps, logged = start(tmp_path, "resume=auto", "checkpoint.keep=1")
    assert steps == 100
    assert any(str(newest) in m for m in logged), logged        # the corrupt file is named
    new = run_state.save(cfg, SPEC, agent, 150)
    assert new.exists() and load_checkpoint(new)["env_steps"] == 150
    # the unreadable file's number (from its name) is not reused: write order stays unique
    assert load_checkpoint(new)["save_seq"] > int(newest.name.split("-")[1].split("_")[0])
    assert newest.exists(), "an unreadable file is reported, never deleted (its run cannot be known)"
    assert not old.exists(), "older than the one just written and of the same run: pruned by keep=1"
    assert newest_valid(tmp_path, log=lambda m: None)[0] == new


# --------------------------------------------------------------------------- corruption

def test_zeroed_bytes_inside_a_checkpoint_are_caught_by_the_checksum(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    path = run_state.save(cfg, SPEC, agent, 100)
    offset, size = tensor_records(path)[0]
    n = min(20_000, size)
    overwrite(path, offset + (size - n) // 2, bytes(n))
    with pytest.raises(CheckpointError, match="checksum") as exc:
        load_checkpoint(path)
    assert str(path) in str(exc.value)


def test_four_flipped_bytes_fall_back_to_the_newest_valid_checkpoint(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    good = run_state.save(cfg, SPEC, agent, 100)
    bad = run_state.save(cfg, SPEC, agent, 200)
    offset, size = tensor_records(bad)[0]
    with open(bad, "r+b") as f:
        f.seek(offset + size // 2)
        word = f.read(4)
        f.seek(offset + size // 2)
        f.write(bytes(b ^ 0xFF for b in word))
    logged: list[str] = []
    assert newest_valid(tmp_path, log=logged.append)[0] == good
    assert any(str(bad) in m and "checksum" in m for m in logged), logged
    cfg, agent, steps, logged = start(tmp_path, "resume=auto")
    assert steps == 100 and bad.exists()
    with pytest.raises(CheckpointError, match="checksum"):       # resume=<path> of it: refused
        start(tmp_path, f"resume={bad}")


def _with_nan(src: Path, dst: Path) -> None:
    """A copy of src with one NaN weight and a checksum that matches (a diverged agent)."""
    payload = torch.load(src, weights_only=True)
    payload["agent"]["actor"][next(iter(payload["agent"]["actor"]))].view(-1)[0] = float("nan")
    digest = getattr(ck, "payload_digest", None)
    if digest is not None:
        payload["digest"] = digest(payload)
    torch.save(payload, dst)


def test_non_finite_tensors_in_a_loaded_checkpoint_are_refused(tmp_path):
    cfg, agent, _, _ = start(tmp_path)
    good = run_state.save(cfg, SPEC, agent, 100)
    nan = tmp_path / "nan.pt"
    _with_nan(good, nan)
    with pytest.raises(CheckpointError, match="non-finite") as exc:
        load_checkpoint(nan)
    assert str(nan) in str(exc.value) and "actor" in str(exc.value)


def test_saving_a_non_finite_agent_is_refused_and_keeps_the_previous(tmp_path):
    cfg, agent, _, _ = start(tmp_path, "checkpoint.keep=1")
    good = run_state.save(cfg, SPEC, agent, 100)
    with torch.no_grad():
        next(agent.actor.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(Exception, match="non-finite"):
        run_state.save(cfg, SPEC, agent, 200)
    assert ckpts(tmp_path) == [good] and load_checkpoint(good)["env_steps"] == 100


# --------------------------------------------------------------------------- failed saves

def _partial_write_then(err: int):
    def failing_save(obj, f, *args, **kwargs):
        f.write(b"\0" * 4096)      # the disk took part of it
        raise OSError(err, os.strerror(err))
    return failing_save


@pytest.mark.parametrize("where", ["torch.save ENOSPC", "fsync EIO"])
def test_a_failed_save_keeps_the_previous_checkpoints_leaves_no_temp_file_and_is_retried(tmp_path, monkeypatch,
                                                                                       where):
    cfg, agent, _, _ = start(tmp_path, "checkpoint.keep=1")
    good = run_state.save(cfg, SPEC, agent, 100)
    before = good.read_bytes()
    with monkeypatch.context() as m:
        if where.startswith("torch.save"):
            m.setattr(torch, "save", _partial_write_then(errno.ENOSPC))
        else:
            def fsync(fd):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            m.setattr(os, "fsync", fsync)
        with pytest.raises(Exception) as exc:
            run_state.save(cfg, SPEC, agent, 200)
    message = str(exc.value)
    reason = os.strerror(errno.ENOSPC if "ENOSPC" in where else errno.EIO)
    assert reason in message and str(checkpoint_dir(tmp_path)) in message, message
    assert "previous checkpoints are kept" in message, message
    assert ckpts(tmp_path) == [good] and good.read_bytes() == before
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == [good.name]   # no temp file
    retried = run_state.save(cfg, SPEC, agent, 300)          # the next interval works again
    assert ckpts(tmp_path) == [retried] and load_checkpoint(retried)["env_steps"] == 300


def test_the_new_file_is_verified_before_older_ones_are_pruned(tmp_path, monkeypatch):
    cfg, agent, _, _ = start(tmp_path, "checkpoint.keep=1")
    good = run_state.save(cfg, SPEC, agent, 100)
    real_save = torch.save

    def save_then_rot(obj, f, *args, **kwargs):   # the bytes that reach the disk differ from what was sent
        real_save(obj, f, *args, **kwargs)
        f.flush()
        offset, size = tensor_records(Path(os.readlink(f"/proc/self/fd/{f.fileno()}")))[0]
        f.seek(offset + size // 2)
        f.write(b"\xff" * 8)
        f.seek(0, os.SEEK_END)
    monkeypatch.setattr(torch, "save", save_then_rot)
    with pytest.raises(Exception, match="checksum"):
        run_state.save(cfg, SPEC, agent, 200)
    monkeypatch.undo()
    assert ckpts(tmp_path) == [good] and load_checkpoint(good)["env_steps"] == 100
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == [good.name]


# --------------------------------------------------------------------------- fresh run into a used run_dir

def test_fresh_run_into_a_run_dir_with_checkpoints_is_refused_before_anything_is_written(tmp_path):
    from fastsac.config import ConfigError
    cfg, agent, _, _ = start(tmp_path)
    existing = run_state.save(cfg, SPEC, agent, 100)
    check = run_dir.check_run_dir_lineage
    with pytest.raises(ConfigError) as exc:
        check(tmp_path, "")
    message = str(exc.value)
    for needed in (str(tmp_path), existing.name, "resume=auto", "resume=<path>", "run_dir"):
        assert needed in message, (needed, message)
    check(tmp_path, "auto")                   # the ways out
    check(tmp_path, str(existing))
    check(tmp_path / "new", "")
