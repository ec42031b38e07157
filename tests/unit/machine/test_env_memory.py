"""The memory a job may use, read without starting anything: cgroup v2 and v1 limits, the free
memory of each bound NUMA node, and OOM-kill evidence (a counter that rose). Bytes per env, the
pre-spawn refusal and the OOM-killed collector: tests/process/launch/test_env_memory_process.py.
"""
from __future__ import annotations

import pytest
from support.fake_sysfs import two_nodes

from fastsac.config import ConfigError, config_from_dict
from fastsac.envs.registry import EnvSpec
from fastsac.launch.memory_check import check_memory
from fastsac.machine import memory_available as memory
from fastsac.machine.plan import plan_job
from fastsac.machine.topology import discover_topology


def test_cgroup_limits_v2_and_v1(tmp_path):
    v2 = tmp_path / "job.slice"
    v2.mkdir()
    (v2 / "memory.max").write_text("1073741824\n")
    (v2 / "memory.current").write_text("73741824\n")
    assert memory.cgroup_memory_left(tmp_path, "0::/job.slice\n") == (1_000_000_000, "the cgroup's memory.max - "
                                                                                      "memory.current")
    (v2 / "memory.max").write_text("max\n")
    assert memory.cgroup_memory_left(tmp_path, "0::/job.slice\n") is None
    v1 = tmp_path / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory.usage_in_bytes").write_text("147483648\n")
    got = memory.cgroup_memory_left(tmp_path, "4:memory:/job\n3:cpuset:/\n0::/\n")
    assert got == (2_000_000_000, "the cgroup (v1) memory.limit_in_bytes - memory.usage_in_bytes"), got
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")       # v1's "no limit"
    assert memory.cgroup_memory_left(tmp_path, "4:memory:/job\n0::/\n") is None


def test_collectors_bound_to_a_node_must_fit_its_free_memory(tmp_path):
    root = two_nodes(tmp_path / "sys", gpu_node=None)
    for nid, free_kb in ((0, 64 * 2**20), (1, 200_000)):       # node 1: ~195 MiB free
        (root / f"devices/system/node/node{nid}/meminfo").write_text(
            f"Node {nid} MemTotal: {128 * 2**20} kB\nNode {nid} MemFree: {free_kb} kB\nNode {nid} Inactive(file): 0 kB\n")
    cfg = config_from_dict({"device": "cpu", "env": {"num_envs": 100_000},
                            "trainer": {"async_options": {"num_collectors": 2, "numa_binding": "inprocess"}}})
    plan = plan_job(cfg, discover_topology(root), "job.yaml", numactl_path=None)
    with pytest.raises(ConfigError) as info:
        check_memory(cfg, EnvSpec(3, 3, 1, 200), plan)
    text = str(info.value)
    assert "the 1 collector(s) bound to NUMA node 1 hold 50,000 of them" in text, text
    assert "the node has 204,800,000 bytes" in text and "the largest env.num_envs that fits is 0" in text, text


def test_oom_evidence_is_a_counter_that_rose():
    assert memory.oom_evidence({"/proc/vmstat oom_kill": 3}, {"/proc/vmstat oom_kill": 4}) == \
        "/proc/vmstat oom_kill 3 -> 4"
    assert memory.oom_evidence({"/proc/vmstat oom_kill": 3}, {"/proc/vmstat oom_kill": 3}) is None
