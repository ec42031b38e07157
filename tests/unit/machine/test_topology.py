"""Topology discovery: cpulist syntax, fake sysfs trees, cpusets, GPU node. No real NUMA needed."""
import dataclasses
import os

import pytest
from support.fake_sysfs import FakeGpu, build_sysfs, four_nodes_with_holes, smt_two_nodes, two_gpus, two_nodes

from fastsac.machine.topology import (
    SYSFS_ROOT_ENV, Topology, discover_topology, format_cpulist, normalize_pci_bus_id, parse_cpulist,
)


def check_invariants(t: Topology) -> None:
    """The invariants promised in fastsac.machine.topology's docstring."""
    ids = [n.id for n in t.nodes]
    assert ids and ids == sorted(set(ids)) and ids[0] >= 0
    for n in t.nodes:
        assert set(n.cpus) <= set(n.all_cpus) and list(n.cpus) == sorted(n.cpus)
        flat = [c for core in n.cores for c in core]
        assert sorted(flat) == list(n.cpus) and len(flat) == len(set(flat))
        assert n.usable == (bool(n.cpus) and n.mem_allowed and n.has_memory)
    assert t.gpu_node == -1 or t.gpu_node in ids


# --------------------------------------------------------------------------- cpulist

@pytest.mark.parametrize("text, cpus", [
    ("", ()), ("\n", ()), ("  ", ()), ("5", (5,)), ("0-3", (0, 1, 2, 3)),
    ("0-3,8-11\n", (0, 1, 2, 3, 8, 9, 10, 11)), ("8-9,0", (0, 8, 9)), ("0-3,2-5", (0, 1, 2, 3, 4, 5)),
    ("0-7:2/4", (0, 1, 4, 5)), ("0, 2", (0, 2)),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text, fragment", [
    ("a", "'a' is not N, A-B"), ("3-1", "runs backwards"), ("1-", "'1-' is not"), ("0,,1", "'' is not"),
    ("0-7:5/4", "0 < used <= group"), ("-1", "'-1' is not"),
])
def test_parse_cpulist_errors_name_the_bad_part(text, fragment):
    with pytest.raises(ValueError, match="bad cpulist") as exc:
        parse_cpulist(text)
    assert fragment in str(exc.value)


@pytest.mark.parametrize("cpus, text", [
    ((), ""), ((3,), "3"), ((0, 1, 2, 3, 8, 9, 10, 11), "0-3,8-11"), ((5, 1, 2), "1-2,5"), ((0, 2, 4), "0,2,4"),
])
def test_format_cpulist_round_trips(cpus, text):
    assert format_cpulist(cpus) == text
    assert parse_cpulist(text) == tuple(sorted(cpus))


# --------------------------------------------------------------------------- fake trees

def test_two_nodes_gpu_on_node_1(tmp_path):
    t = discover_topology(two_nodes(tmp_path, gpu_node=1))
    check_invariants(t)
    assert t.node_ids == (0, 1) and t.usable_node_ids == (0, 1)
    assert t.node(0).cpus == (0, 1, 2, 3) and t.node(1).cpus == (4, 5, 6, 7)
    assert t.allowed_cpus == tuple(range(8))   # the fake tree is the machine, not this 2-CPU host
    assert t.gpu_node == 1 and [g.pci_bus_id for g in t.gpus] == ["0000:41:00.0"]  # NIC/NVSwitch ignored
    assert t.numa_supported and t.node(1).distances == (20, 10) and t.node(1).mem_total_kb == 2 * 1024 * 1024
    with pytest.raises(KeyError):
        t.node(7)


def test_four_nodes_with_holes_and_unknown_gpu_node(tmp_path):
    t = discover_topology(four_nodes_with_holes(tmp_path, gpu_node=-1))
    check_invariants(t)
    assert t.node_ids == (0, 1, 2, 3)
    assert t.node(2).cpus == (4, 5, 12, 13) and format_cpulist(t.node(3).cpus) == "6-7,14-15"
    assert t.gpu_node == -1 and t.gpus[0].numa_node == -1
    assert any("reports numa_node -1" in n for n in t.notes)


def test_no_gpu(tmp_path):
    t = discover_topology(two_nodes(tmp_path, gpu_node=None))
    assert t.gpu_node == -1 and t.gpus == ()
    assert any("no NVIDIA GPU" in n for n in t.notes)


def test_gpu_on_a_node_that_does_not_exist_is_unknown(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-1"}, gpus=[FakeGpu("0000:41:00.0", 3)]))
    assert t.gpu_node == -1 and any("not a node of this machine" in n for n in t.notes)


def test_vga_class_gpu_counts_too(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-1", 1: "2-3"},
                                      gpus=[FakeGpu("0000:01:00.0", 1, pci_class="0x030000")]))
    assert t.gpu_node == 1


def test_env_var_selects_the_fake_root(tmp_path, monkeypatch):
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(two_nodes(tmp_path)))
    t = discover_topology()
    assert t.sysfs_root == str(tmp_path) and t.node_ids == (0, 1) and t.gpu_node == 1


def test_no_numa_sysfs_gives_one_node_with_all_cpus(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, None, cpu_online="0-5"))
    check_invariants(t)
    assert not t.numa_supported and t.node_ids == (0,) and t.node(0).cpus == tuple(range(6))
    assert t.node(0).usable and any("no NUMA nodes" in n for n in t.notes)


def test_no_numa_sysfs_honours_explicit_allowed_cpus(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, None, cpu_online="0-5"), allowed_cpus=[1, 2])
    assert t.node(0).cpus == (1, 2) and t.allowed_cpus == (1, 2)


# --------------------------------------------------------------------------- cpusets

def test_allowed_cpus_restrict_nodes(tmp_path):
    t = discover_topology(two_nodes(tmp_path), allowed_cpus=[2, 3, 4])
    check_invariants(t)
    assert t.node(0).cpus == (2, 3) and t.node(0).all_cpus == (0, 1, 2, 3) and t.node(1).cpus == (4,)
    assert t.allowed_cpus == (2, 3, 4)
    assert "of 0-3" in t.node(0).describe()


def test_node_without_allowed_cpus_is_unusable_and_says_why(tmp_path):
    t = discover_topology(two_nodes(tmp_path), allowed_cpus=[0, 1])
    check_invariants(t)
    assert t.usable_node_ids == (0,)
    assert t.node(1).unusable_reason == ("none of its CPUs (4-7) are in this process's allowed CPUs "
                                         "(cpuset/affinity)")


def test_node_outside_mems_allowed_is_unusable(tmp_path):
    t = discover_topology(two_nodes(tmp_path), mems_allowed=[1])
    assert t.usable_node_ids == (1,)
    assert "not in this process's Mems_allowed_list" in t.node(0).unusable_reason


def test_memoryless_and_memory_only_nodes(tmp_path):
    t = discover_topology(build_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: ""}, has_memory="0,2"))
    check_invariants(t)
    assert t.usable_node_ids == (0,)
    assert "memory-less node" in t.node(1).unusable_reason
    assert "memory-only node" in t.node(2).unusable_reason
    assert "unusable:" in t.describe()


def test_smt_siblings_are_grouped_into_cores(tmp_path):
    t = discover_topology(smt_two_nodes(tmp_path))
    check_invariants(t)
    assert t.node(0).cores == ((0, 8), (1, 9), (2, 10), (3, 11))
    assert t.node(0).core_ordered_cpus == (0, 8, 1, 9, 2, 10, 3, 11)


def test_smt_siblings_outside_the_allowed_set_are_dropped(tmp_path):
    t = discover_topology(smt_two_nodes(tmp_path), allowed_cpus=[0, 1, 8])
    assert t.node(0).cores == ((0, 8), (1,))


def test_real_root_uses_the_process_affinity():
    t = discover_topology("/sys")
    check_invariants(t)
    assert t.allowed_cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert t.usable_nodes, t.describe()   # this host: at least node 0


# --------------------------------------------------------------------------- GPUs

def test_gpus_in_pci_order_and_cuda_visible_devices(tmp_path):
    root = two_gpus(tmp_path)
    t = discover_topology(root, cuda_visible_devices=None)
    assert [g.pci_bus_id for g in t.gpus] == ["0000:41:00.0", "0000:c1:00.0"] and t.gpu_node == 0
    assert t.gpu_node_for("cuda:1") == 1 and t.gpu_node_for("cuda") == 0 and t.gpu_node_for("cpu") == -1
    assert t.gpu_node_for("cuda:7") == 0   # more than sysfs shows: fall back to the first GPU
    assert discover_topology(root, cuda_visible_devices="1").gpu_node == 1
    assert discover_topology(root, cuda_visible_devices="1,0").gpus[1].numa_node == 0
    assert discover_topology(root, cuda_visible_devices="").gpu_node == -1          # no GPU visible
    assert discover_topology(root, cuda_visible_devices="-1,1").gpu_node == -1      # CUDA stops at -1
    uuid = discover_topology(root, cuda_visible_devices="GPU-1234")
    assert uuid.gpu_node == -1 and any("UUIDs" in n for n in uuid.notes)


def test_uuid_is_fine_when_all_gpus_share_a_node(tmp_path):
    root = build_sysfs(tmp_path, {0: "0-3", 1: "4-7"},
                       gpus=[FakeGpu("0000:41:00.0", 1), FakeGpu("0000:42:00.0", 1)])
    assert discover_topology(root, cuda_visible_devices="GPU-abc").gpu_node == 1


def test_cuda_visible_devices_from_the_environment_only_under_real_sysfs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert discover_topology(two_gpus(tmp_path)).gpu_node == 0   # fake root: the shell does not leak in


def test_explicit_pci_bus_id(tmp_path):
    root = two_gpus(tmp_path)
    assert discover_topology(root, gpu_pci_bus_id="00000000:C1:00.0").gpu_node == 1
    missing = discover_topology(root, gpu_pci_bus_id="0000:99:00.0")
    assert missing.gpu_node == -1 and any("0000:99:00.0 not found" in n for n in missing.notes)


@pytest.mark.parametrize("text, norm", [
    ("0000:3b:00.0", "0000:3b:00.0"), ("00000000:3B:00.0", "0000:3b:00.0"), ("3b:00.0", "0000:3b:00.0"),
    ("0001:c1:00.1", "0001:c1:00.1"),
])
def test_normalize_pci_bus_id(text, norm):
    assert normalize_pci_bus_id(text) == norm


def test_normalize_pci_bus_id_rejects_garbage():
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci_bus_id("GPU-1234")


def test_topology_is_frozen(tmp_path):
    t = discover_topology(two_nodes(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.gpu_node = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.nodes[0].cpus = ()
