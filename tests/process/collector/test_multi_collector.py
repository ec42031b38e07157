"""Several collectors: plans, an end-to-end run, and the topology-free resume contract."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.e2e_helpers import job_segments, launch, newest_checkpoint, scalar_tags, tiny_config

from fastsac.run_dir.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[3]


def plan_json(config: Path, *overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(config), "--plan", "--json", *overrides],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.process
def test_default_config_plans_one_unbound_collector_without_numactl(tmp_path):
    # its own run_dir: the default one may hold a quick-start run's checkpoints (a fresh run is refused there)
    plan = plan_json(REPO / "configs" / "quickstart.yaml", "trainer.asynchronous=true", f"run_dir={tmp_path / 'run'}")
    assert plan["binding"] == "off"
    assert len(plan["collectors"]) == 1
    for proc in [plan["learner"], *plan["collectors"]]:
        assert proc["node"] is None
        assert "numactl" not in " ".join(proc["argv"])
        assert proc["argv"][1:3] == ["-m", f"fastsac.{proc['role']}_main"]
    c0 = plan["collectors"][0]
    assert (c0["env_first"], c0["env_count"]) == (0, 32)


@pytest.mark.process
def test_two_collectors_train_with_disjoint_envs_and_seeds(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, env={"num_envs": 9, "max_episode_steps": 20},
                      trainer={"num_iterations": 40, "async_options": {"num_collectors": 2}})
    plan = plan_json(cfg)
    blocks = [(c["env_first"], c["env_count"]) for c in plan["collectors"]]
    assert blocks == [(0, 5), (5, 4)]  # uneven split: the first collector takes the extra env
    assert [c["seed"] for c in plan["collectors"]] == [1, 2]
    proc = launch(cfg)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = tmp_path / "run"
    tags = scalar_tags(run)
    for i in (0, 1):
        for name in ("env_steps_per_s", "ring_fill", "policy_lag", "env_step_ms", "push_ms"):
            assert f"collector{i}/{name}" in tags, f"collector{i}/{name}"
        log = (run / "logs" / f"collector{i}.log").read_text()
        first, count = blocks[i]
        assert re.search(rf"envs {first}\.\.{first + count - 1} of pendulum", log), log
    assert load_checkpoint(newest_checkpoint(run))["env_steps"] >= 40 * 9
    assert job_segments(job_name) == []


@pytest.mark.process
def test_resume_across_collector_counts(tmp_path, job_name):
    cfg = tiny_config(tmp_path, job_name, trainer={"num_iterations": 8, "async_options": {"num_collectors": 2}})
    assert launch(cfg).returncode == 0
    run = tmp_path / "run"
    two = load_checkpoint(newest_checkpoint(run))
    proc = launch(cfg, "trainer.async_options.num_collectors=1", "trainer.num_iterations=16", "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    one = load_checkpoint(newest_checkpoint(run))
    assert one["env_steps"] >= 16 * 8 > two["env_steps"]
    proc = launch(cfg, "trainer.async_options.num_collectors=2", "trainer.num_iterations=24", "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = load_checkpoint(newest_checkpoint(run))
    assert again["env_steps"] >= 24 * 8 and again["agent"]["num_updates_done"] > one["agent"]["num_updates_done"]
    assert job_segments(job_name) == []
