"""Build fake sysfs trees in a tmp dir, for topology discovery via FASTSAC_SYSFS_ROOT.

Only the files fastsac.machine.topology reads are written:
  devices/system/node/node<N>/{cpulist,distance,meminfo}, devices/system/node/has_memory,
  devices/system/cpu/online, devices/system/cpu/cpu<C>/topology/core_cpus_list (optional),
  bus/pci/devices/<bus id>/{vendor,class,numa_node}.

Every tree also gets PCI devices that must be ignored: an Intel NIC (wrong vendor) and an
NVIDIA non-display device (an NVSwitch-like bridge, class 0x0680), so GPU detection is tested
against realistic noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from fastsac.machine.topology import format_cpulist, parse_cpulist

NVIDIA = "0x10de"
GPU_3D = "0x030200"      # 3D controller: H100/A100 etc.
GPU_VGA = "0x030000"


@dataclass(frozen=True)
class FakeGpu:
    bus_id: str
    numa_node: int                 # -1 = unknown, like firmware that does not say
    vendor: str = NVIDIA
    pci_class: str = GPU_3D


def build_sysfs(root: Path, nodes: Mapping[int, str] | None, *, gpus: Sequence[FakeGpu] = (),
                has_memory: str | None = None, siblings: Mapping[int, str] | None = None,
                cpu_online: str | None = None, noise: bool = True) -> Path:
    """Write a tree under `root` and return it.

    nodes:      node id -> cpulist text ("0-3,8-11"; "" for a memory-only node);
                None = no devices/system/node at all (a kernel without NUMA).
    has_memory: text of node/has_memory; None = not written (all nodes have memory).
    siblings:   cpu -> core_cpus_list text; None = no SMT information.
    cpu_online: text of cpu/online; default: every CPU of `nodes`.
    """
    root = Path(root)
    all_cpus: set[int] = set()
    if nodes is not None:
        node_dir = root / "devices" / "system" / "node"
        node_dir.mkdir(parents=True, exist_ok=True)
        ids = sorted(nodes)
        for nid in ids:
            d = node_dir / f"node{nid}"
            d.mkdir()
            (d / "cpulist").write_text(nodes[nid] + "\n")
            all_cpus.update(parse_cpulist(nodes[nid]))
            (d / "distance").write_text(" ".join("10" if o == nid else "20" for o in ids) + "\n")
            (d / "meminfo").write_text(f"Node {nid} MemTotal:       {1024 * 1024 * (nid + 1)} kB\n"
                                       f"Node {nid} MemFree:        {1024 * 1024 * (nid + 1) // 2} kB\n")
        for name in ("online", "possible"):
            (node_dir / name).write_text(format_cpulist(ids) + "\n")
        if has_memory is not None:
            (node_dir / "has_memory").write_text(has_memory + "\n")
    cpu_dir = root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    (cpu_dir / "online").write_text((cpu_online if cpu_online is not None else format_cpulist(all_cpus)) + "\n")
    for cpu, text in (siblings or {}).items():
        t = cpu_dir / f"cpu{cpu}" / "topology"
        t.mkdir(parents=True, exist_ok=True)
        (t / "core_cpus_list").write_text(text + "\n")
        (t / "thread_siblings_list").write_text(text + "\n")
    pci = root / "bus" / "pci" / "devices"
    pci.mkdir(parents=True, exist_ok=True)
    devices = list(gpus)
    if noise:
        devices += [FakeGpu("0000:00:1f.6", 0, vendor="0x8086", pci_class="0x020000"),
                    FakeGpu("0000:05:00.0", 0, vendor=NVIDIA, pci_class="0x068000")]
    for g in devices:
        d = pci / g.bus_id
        d.mkdir()
        (d / "vendor").write_text(g.vendor + "\n")
        (d / "class").write_text(g.pci_class + "\n")
        (d / "numa_node").write_text(f"{g.numa_node}\n")
    return root


def _gpu(gpu_node: int | None) -> list[FakeGpu]:
    return [] if gpu_node is None else [FakeGpu("0000:41:00.0", gpu_node)]


def two_nodes(root: Path, gpu_node: int | None = 1, **kw) -> Path:
    """node 0: CPUs 0-3, node 1: CPUs 4-7. gpu_node: int (-1 = unknown) or None = no GPU."""
    return build_sysfs(root, {0: "0-3", 1: "4-7"}, gpus=_gpu(gpu_node), **kw)


def four_nodes_with_holes(root: Path, gpu_node: int | None = -1, **kw) -> Path:
    """4 nodes, 4 CPUs each, interleaved like a 2-socket NPS2 box: node k = 2k-2k+1,2k+8-2k+9."""
    nodes = {k: f"{2 * k}-{2 * k + 1},{2 * k + 8}-{2 * k + 9}" for k in range(4)}
    return build_sysfs(root, nodes, gpus=_gpu(gpu_node), **kw)


def smt_two_nodes(root: Path, gpu_node: int | None = 0) -> Path:
    """2 nodes x 4 cores x 2 threads; the sibling of CPU c is c+8 (Linux's usual numbering)."""
    siblings = {}
    for c in range(8):
        siblings[c] = siblings[c + 8] = f"{c},{c + 8}"
    return build_sysfs(root, {0: "0-3,8-11", 1: "4-7,12-15"}, gpus=_gpu(gpu_node), siblings=siblings)


def two_gpus(root: Path) -> Path:
    """2 nodes, one GPU on each: 0000:41:00.0 on node 0, 0000:c1:00.0 on node 1."""
    return build_sysfs(root, {0: "0-3", 1: "4-7"},
                       gpus=[FakeGpu("0000:c1:00.0", 1), FakeGpu("0000:41:00.0", 0, pci_class=GPU_VGA)])
