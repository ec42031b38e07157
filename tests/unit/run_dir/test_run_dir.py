"""One run per run_dir (fastsac.run_dir.contents): what counts as a run's output, the refusal of a
fresh run into a used run_dir and of a checkpoint of another run, the torch-free run id peek,
and which paths are a run's own files."""
from __future__ import annotations

import json

import pytest
import torch

from fastsac.config import ConfigError
from fastsac.run_dir.checkpoint import RunCheckpoints, read_header
from fastsac.run_dir.contents import check_run_dir_lineage, own_file_of_a_run, peek_run_id, run_outputs


def _payload(steps):
    return {"env_steps": steps, "agent": {"w": torch.full((8,), float(steps))}, "env": {"name": "pendulum"}}


def _checkpoint(run_dir, steps=3):
    return RunCheckpoints.fresh(run_dir, keep=3).save(_payload(steps))


def test_a_fresh_run_into_a_run_dir_with_checkpoints_names_the_files_and_the_ways_out(tmp_path):
    check_run_dir_lineage(tmp_path, "")                 # nothing there: fine
    path = _checkpoint(tmp_path)
    with pytest.raises(ConfigError) as exc:
        check_run_dir_lineage(tmp_path, "")
    message = str(exc.value)
    for needed in (str(tmp_path), path.name, read_header(path).run_id, "resume=auto", "resume=<path>", "new run_dir"):
        assert needed in message, (needed, message)
    check_run_dir_lineage(tmp_path, "auto")
    check_run_dir_lineage(tmp_path, str(path))


@pytest.mark.parametrize("leftover", ["metrics.jsonl", "tb/events.out.tfevents.1.host", "logs/learner.log",
                                      "wandb/offline-run-x/run.wandb"])
def test_a_killed_runs_metrics_tensorboard_or_logs_count_as_run_output(tmp_path, leftover):
    """A run killed before its first checkpoint leaves metrics, event files and logs: a fresh run
    would append to them, so they count like checkpoints."""
    (tmp_path / leftover).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / leftover).write_text('{"env_steps": 8}\n')
    assert run_outputs(tmp_path)
    with pytest.raises(ConfigError, match=leftover.split("/")[0]):
        check_run_dir_lineage(tmp_path, "")
    check_run_dir_lineage(tmp_path, "auto")


def test_the_lock_numa_check_reports_and_empty_files_are_no_run_output(tmp_path):
    (tmp_path / ".fastsac.lock").write_text("{}")
    (tmp_path / "logs" / "numa-check.00ff").mkdir(parents=True)
    (tmp_path / "logs" / "numa-check.00ff" / "learner.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    assert run_outputs(tmp_path) == []
    check_run_dir_lineage(tmp_path, "")


def test_resume_from_another_runs_checkpoint_is_refused_naming_both_runs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a_file, b_file = _checkpoint(a), _checkpoint(b)
    a_id, b_id = read_header(a_file).run_id, read_header(b_file).run_id
    with pytest.raises(ConfigError) as exc:
        check_run_dir_lineage(b, str(a_file))
    message = str(exc.value)
    for needed in (a_id, b_id, str(b), "new run_dir", "resume=auto"):
        assert needed in message, (needed, message)
    check_run_dir_lineage(a, str(a_file))                 # its own run_dir
    check_run_dir_lineage(tmp_path / "empty", str(a_file))   # a new one: run a continues there alone


def test_resume_into_a_run_dir_holding_only_another_runs_metrics_is_refused(tmp_path):
    a_file = _checkpoint(tmp_path / "a")
    b = tmp_path / "b"
    b.mkdir()
    (b / "metrics.jsonl").write_text(json.dumps({"env_steps": 8, "run_id": "0badf00d", "incarnation": 1}) + "\n")
    with pytest.raises(ConfigError, match="0badf00d"):
        check_run_dir_lineage(b, str(a_file))


def test_the_run_id_is_read_without_torch_and_garbage_gives_none(tmp_path):
    path = _checkpoint(tmp_path)
    assert peek_run_id(path) == read_header(path).run_id
    for junk in (b"", b"not a zip", path.read_bytes()[:100]):
        (tmp_path / "junk.pt").write_bytes(junk)
        assert peek_run_id(tmp_path / "junk.pt") is None


def test_a_runs_own_files_are_recognised(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run)
    for own in ("metrics.jsonl", ".fastsac.lock", "tb/events.x", "logs/learner.log", "wandb/x/y",
                "checkpoints/a.pt"):
        assert own_file_of_a_run(run / own) == run, own
    for other in ("actor.pt", "exports/actor.onnx"):
        assert own_file_of_a_run(run / other) is None, other
    assert own_file_of_a_run(tmp_path / "metrics.jsonl") is None     # not a run_dir
