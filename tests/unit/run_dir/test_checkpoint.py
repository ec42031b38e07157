"""Checkpoint files: atomic verified writes, retention by run and write order, leftovers of killed
writers, corrupt and foreign files (tests/unit/training/test_checkpoint_integrity.py drives the trainers' save/restore)."""
import os
import random

import pytest
import torch

from fastsac.run_dir.checkpoint import (
    FORMAT,
    CheckpointError,
    RunCheckpoints,
    checkpoint_dir,
    load_checkpoint,
    newest_valid,
    read_header,
)


def _payload(steps):
    return {"env_steps": steps, "agent": {"w": torch.full((64,), float(steps)), "n": steps},
            "env": {"name": "pendulum"}}


def _names(run):
    return sorted(p.name for p in checkpoint_dir(run).glob("ckpt_*.pt"))


def test_prunes_to_keep_by_write_order_and_newest_valid_skips_corrupt(tmp_path):
    run = RunCheckpoints.fresh(tmp_path, keep=3)
    paths = [run.save(_payload(steps)) for steps in (10, 20, 30, 40)]
    assert _names(tmp_path) == sorted(p.name for p in paths[1:])
    assert [read_header(p).save_seq for p in paths[1:]] == [2, 3, 4]
    newest = paths[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a crash without atomic writes
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(newest)
    skipped = []
    assert newest_valid(tmp_path, log=skipped.append)[0] == paths[-2]
    assert skipped and "skipping" in skipped[0] and str(newest) in skipped[0]


def test_never_prunes_another_runs_files_nor_unverifiable_ones(tmp_path):
    other = RunCheckpoints.fresh(tmp_path, keep=1).save(_payload(1000))
    run = RunCheckpoints.fresh(tmp_path, keep=1)
    first = run.save(_payload(5))
    first_bytes = first.read_bytes()
    broken = checkpoint_dir(tmp_path) / first.name.replace("-000001_", "-000009_")
    broken.write_bytes(first_bytes[: len(first_bytes) // 2])     # unreadable: whose it is cannot be known
    logged = []
    run.log = logged.append
    second = run.save(_payload(6))
    assert set(_names(tmp_path)) == {other.name, broken.name, second.name}
    assert any(str(broken) in m for m in logged), logged


def test_removes_temp_files_of_dead_writers_only(tmp_path):
    d = checkpoint_dir(tmp_path)
    d.mkdir(parents=True)
    dead = d / ".tmp_ckpt_999999999_a.pt"
    live = d / f".tmp_ckpt_{os.getpid()}_b.pt"
    dead.write_text("x")
    live.write_text("x")
    RunCheckpoints.fresh(tmp_path, keep=3).save(_payload(5))
    assert not dead.exists() and live.exists()


def test_not_a_checkpoint_and_older_format(tmp_path):
    p = tmp_path / "x.pt"
    torch.save({"hello": 1}, p)
    with pytest.raises(CheckpointError, match="not a fastsac checkpoint"):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"format": FORMAT, "format_version": 1, **_payload(3)}, p)
    with pytest.raises(CheckpointError, match="format version 1 .*without a checksum"):
        load_checkpoint(p)
    torch.save({"format": FORMAT, "format_version": 2, **_payload(3)}, p)
    with pytest.raises(CheckpointError, match="format version 2 .*every hidden layer at full width"):
        load_checkpoint(p)


def test_loads_with_plain_torch_load_weights_only(tmp_path):
    path = RunCheckpoints.fresh(tmp_path, keep=1).save(_payload(7))
    raw = torch.load(path, weights_only=True)
    assert raw["env_steps"] == 7 and torch.equal(raw["agent"]["w"], torch.full((64,), 7.0))
    assert raw["digest"].startswith("sha256:")


def test_any_flipped_word_is_caught_or_harmless(tmp_path):
    """4-byte flips all over a file (zip headers, pickle, tensor bytes, checksum): every load
    either raises CheckpointError or returns exactly what was saved. Never a silent change."""
    path = RunCheckpoints.fresh(tmp_path, keep=1).save(_payload(11))
    original = path.read_bytes()
    expected = load_checkpoint(path)
    rng = random.Random(0)
    bad = tmp_path / "bad.pt"
    caught = 0
    for offset in sorted(rng.sample(range(len(original) - 4), 150)):
        data = bytearray(original)
        data[offset:offset + 4] = bytes(b ^ 0xFF for b in data[offset:offset + 4])
        bad.write_bytes(bytes(data))
        for mmap in (False, True):
            try:
                got = load_checkpoint(bad, mmap=mmap)
            except CheckpointError:
                caught += 1
                continue
            assert got["digest"] == expected["digest"] and torch.equal(got["agent"]["w"], expected["agent"]["w"])
    assert caught > 100


def test_large_finite_values_are_not_taken_for_non_finite(tmp_path):
    # the finite check's fast path sums each tensor: a sum that overflows must not refuse a finite state
    payload = _payload(9)
    payload["agent"]["big"] = torch.full((16,), 3e38)
    payload["agent"]["half"] = torch.full((100,), 6e4, dtype=torch.float16)
    path = RunCheckpoints.fresh(tmp_path, keep=1).save(payload)
    assert torch.equal(load_checkpoint(path)["agent"]["big"], payload["agent"]["big"])
    payload["agent"]["big"][3] = float("nan")
    with pytest.raises(Exception, match=r"non-finite .*agent\.big"):
        RunCheckpoints.fresh(tmp_path / "b", keep=1).save(payload)


class _Malicious:
    """A pickle that would run code when loaded without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_malicious_pickle_is_refused_without_advising_weights_only_false(tmp_path):
    """torch's own message advises re-running torch.load with weights_only=False: the one thing that
    would run the file's code. The refusal names what was refused, never that advice."""
    marker = tmp_path / "pwned"
    path = tmp_path / "ckpt_deadbeef-000001_00000000000008.pt"
    torch.save({"format": FORMAT, "agent": _Malicious(marker)}, path)
    for load in (load_checkpoint, read_header):
        with pytest.raises(CheckpointError) as exc:
            load(path)
        message = str(exc.value)
        assert "weights_only" not in message and "trusted source" not in message, message
        assert str(path) in message and "GLOBAL posix.mkdir" in message and "no code in it ran" in message, message
        assert "\n" not in message
    assert not marker.exists()
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(CheckpointError, match="is corrupt or truncated"):
        load_checkpoint(tmp_path / "junk.pt")
