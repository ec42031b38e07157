"""Weights & Biases as the third scalar sink: online without credentials is refused before
anything starts (fastsac.launch.preflight), and a W&B failure during a run costs W&B only."""
from __future__ import annotations

import json

import pytest

from fastsac.config import ConfigError, config_from_dict
from fastsac.launch import preflight
from fastsac.training import wandb_sink
from fastsac.training.telemetry import MetricsLogger


def _cfg(tmp_path, **wandb):
    return config_from_dict({"run_dir": str(tmp_path / "run"), "logging": {"wandb": {"enabled": True, **wandb}}})


def test_online_without_credentials_is_refused_and_each_credential_is_enough(tmp_path, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    with pytest.raises(ConfigError) as exc:
        preflight.check_extras(_cfg(tmp_path))
    message = str(exc.value)
    for needed in ("logging.wandb.mode", "WANDB_API_KEY", "wandb login", "logging.wandb.mode=offline",
                   "api.wandb.ai"):
        assert needed in message, (needed, message)
    preflight.check_extras(_cfg(tmp_path, mode="offline"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    preflight.check_extras(_cfg(tmp_path))
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password x\n")
    preflight.check_extras(_cfg(tmp_path))
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    preflight.check_extras(_cfg(tmp_path))


class _Broken:
    def __init__(self, cfg, fail_at: str):
        if fail_at == "init":
            raise RuntimeError("wandb.errors.UsageError: api_key not configured (no-tty)")
        self.calls = 0

    def log(self, step, values):
        raise ConnectionError("network is unreachable")

    def close(self):
        raise ConnectionError("network is unreachable")


@pytest.mark.parametrize("fail_at", ["init", "log"])
def test_a_wandb_failure_warns_once_and_the_other_sinks_go_on(tmp_path, monkeypatch, capsys, fail_at):
    monkeypatch.setattr(wandb_sink, "WandbSink", lambda cfg: _Broken(cfg, fail_at))
    cfg = _cfg(tmp_path)
    log = MetricsLogger(cfg.run_path, cfg=cfg)
    for step in (8, 16):
        log.scalars(step, {"perf/updates_per_s": 1.0})
    log.close()
    rows = [json.loads(line) for line in (cfg.run_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [8, 16]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "Weights & Biases" in line]
    assert len(warnings) == 1 and "training goes on without it" in warnings[0], warnings
