"""fastsac-export through its CLI: the exported TorchScript / ONNX actor gives the trainer's
deterministic actions (FastSAC.act(..., deterministic=True)) on real env observations, at any
batch size; bad input is exit 2 with nothing written.

Checkpoints are written by the run's own save path (fastsac.training.state.save) from a FastSAC agent
whose observation normalizer has non-trivial statistics, so a normalizer left out or applied
twice would show.
"""
from __future__ import annotations

import numpy as np
import pytest
from support.export_checkpoints import make_checkpoint

from fastsac.config import config_from_dict

# torch deprecates TorchScript in favour of torch.export, but still loads it; the format is asked for
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")


def test_a_written_file_that_does_not_reproduce_the_actor_is_an_error_and_is_not_kept(tmp_path, monkeypatch):
    from fastsac.run_dir.checkpoint import load_checkpoint
    from fastsac.tools import export
    path, _ = make_checkpoint(tmp_path, "pendulum")
    payload = load_checkpoint(path)
    policy = export.load_policy(path, payload, config_from_dict(payload["config"]), np.full(1, -2.0), np.full(1, 2.0))
    real = export._write_torchscript

    def off_by_a_little(actor, meta, out):   # a writer whose file acts slightly differently
        run = real(actor, meta, out)
        return lambda obs: run(obs) + 1e-3

    monkeypatch.setattr(export, "_write_torchscript", off_by_a_little)
    out = tmp_path / "actor.pt"
    with pytest.raises(RuntimeError, match="does not reproduce the actor"):
        export.export(policy, "torchscript", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]      # neither OUT nor its temp file
