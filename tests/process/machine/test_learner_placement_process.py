"""Several learners per machine and several machines: plans, config checks, the status view.

End-to-end runs of learner groups are in tests/process/learner/test_distributed_e2e.py.
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.fake_sysfs import two_gpus
from support.learner_plans import cfg, plan

from fastsac.machine.plan_output import format_plan, plan_to_json
from fastsac.machine.topology import discover_topology

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def gpus2(tmp_path):
    """node 0: CPUs 0-3 with cuda:0, node 1: CPUs 4-7 with cuda:1."""
    return discover_topology(two_gpus(tmp_path / "sys"))


@pytest.mark.process
def test_one_learner_plan_has_no_learner_group_parts(gpus2, tmp_path):
    p = plan(cfg(num_collectors=2), gpus2)
    assert p.world_size == 1 and "learners:" not in format_plan(p) and "1 learner + 2" in format_plan(p)
    assert set(plan_to_json(p)) == {"binding", "requested_binding", "placement", "numactl", "config_path",
                                    "topology", "learner", "collectors", "notes"}
    for name in ("quickstart.yaml",):   # and through the CLI, on this machine
        out = subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs" / name), "--plan",
                              f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "learners:" not in out.stdout and "--learner-index" not in out.stdout
        assert "job plan: 1 learner + 1 collector(s)" in out.stdout


def _launch_plan(tmp_path, *overrides, env=None):
    return subprocess.run([sys.executable, "-m", "fastsac.launcher", str(REPO / "configs" / "quickstart.yaml"),
                           "--plan", f"run_dir={tmp_path / 'run'}", *overrides], capture_output=True, text=True,
                          env=env)


@pytest.mark.process
@pytest.mark.parametrize("overrides, message", [
    (["distributed.nnodes=2", "distributed.node_rank=2"], "distributed.node_rank: 2 is not a machine"),
    (["distributed.num_learners=2"], "distributed.num_learners: 2 learners but only 1 collector"),
    (["distributed.num_learners=2", "trainer.async_options.num_collectors=2",
      "distributed.collector_learners=[0,0]"], "distributed.collector_learners: learner 1 has no collector"),
    (["distributed.num_learners=2", "trainer.async_options.num_collectors=2",
      "distributed.learner_devices=[cuda:0,cuda:1]"], "distributed.learner_devices[0]: 'cuda:0' was requested"),
])
def test_invalid_combinations_exit_2_naming_the_key(tmp_path, overrides, message):
    out = _launch_plan(tmp_path, *overrides)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.process
def test_master_port_in_use_on_node_rank_0_exits_2(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = _launch_plan(tmp_path, "distributed.num_learners=2", "trainer.async_options.num_collectors=2",
                           f"distributed.master_port={port}", "distributed.master_addr=127.0.0.1")
        assert out.returncode == 2 and f"distributed.master_port: {port} on 127.0.0.1 is already in use" \
            in out.stderr, out.stderr
        # node_rank 1 does not host the rendezvous: nothing to check there (the port is node 0's)
        env = {**os.environ, "NNODES": "2", "NODE_RANK": "1", "MASTER_PORT": str(port)}
        assert _launch_plan(tmp_path, env=env).returncode == 0
