"""Machine topology: NUMA nodes, the CPUs and memory this process may use, the GPU's node.

Pure functions returning frozen dataclasses, torch-free and numpy-free: the launcher, the
`--plan` output and the NUMA checks in the (slow, emulated) 2-node guest import this module.

Sources (all read once, at discovery):
  <sysfs>/devices/system/node/node<N>/cpulist       CPUs of node N (cpulist syntax, holes allowed)
  <sysfs>/devices/system/node/node<N>/distance      SLIT row (optional)
  <sysfs>/devices/system/node/node<N>/meminfo       "Node N MemTotal/MemFree/Inactive(file): ... kB"
                                                    (optional)
  <sysfs>/devices/system/node/has_memory            nodes with memory (optional; absent = all)
  <sysfs>/devices/system/cpu/cpu<C>/topology/core_cpus_list (or thread_siblings_list)
                                                    SMT siblings (optional), so CPU slices are
                                                    whole physical cores
  <sysfs>/devices/system/cpu/online                 all CPUs, used only without NUMA sysfs
  <sysfs>/bus/pci/devices/<bus id>/{vendor,class,numa_node}   NVIDIA GPUs and their node
  os.sched_getaffinity(0), /proc/self/status Mems_allowed_list
                                                    what the cpuset/container lets us use

<sysfs> is /sys, or $FASTSAC_SYSFS_ROOT (a directory laid out like /sys) so tests and
`--plan` dry runs can describe another machine. Under such a fake root the tree *is* the
machine: the real process's affinity and Mems_allowed are not applied unless the caller
passes `allowed_cpus` / `mems_allowed` explicitly.

Invariants of a discovered Topology:
  * nodes are sorted by id, ids are unique and >= 0; at least one node exists.
  * for every node: cpus is a subset of all_cpus, sorted; the CPUs of `cores` flattened are
    exactly the set `cpus` (core-major order, siblings adjacent); usable <=> cpus non-empty,
    memory allowed (Mems_allowed) and present (has_memory).
  * gpu_node is -1 (unknown / no GPU) or the id of a node in `nodes`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

SYSFS_ROOT_ENV = "FASTSAC_SYSFS_ROOT"
REAL_SYSFS = "/sys"
NVIDIA_VENDOR = 0x10DE
PCI_CLASS_DISPLAY = 0x03  # base class: 0x0300 VGA, 0x0302 3D controller (data-centre GPUs)

__all__ = [
    "NumaNode", "GpuDevice", "Topology", "discover_topology", "parse_cpulist", "format_cpulist",
    "sysfs_root", "normalize_pci_bus_id", "read_proc_status_list", "SYSFS_ROOT_ENV",
]


# --------------------------------------------------------------------------- cpulist syntax

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse Linux cpulist/nodelist syntax ("0-3,8-11", "5", "", "0-15:2/4") -> sorted unique ids.

    Accepts everything the kernel prints (comma-separated ids and inclusive ranges) plus the
    `A-B:used/group` stride form that cpuset files accept as input. Whitespace and a trailing
    newline are ignored; an empty list is valid (a memory-only node has no CPUs).
    Raises ValueError naming the bad part.
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        m = _RANGE_RE.match(part)
        if not m:
            raise ValueError(f"bad cpulist {text!r}: {part!r} is not N, A-B or A-B:used/group")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"bad cpulist {text!r}: range {part!r} runs backwards")
        if m.group(3) is not None:
            used, group = int(m.group(3)), int(m.group(4))
            if not 0 < used <= group:
                raise ValueError(f"bad cpulist {text!r}: {part!r} needs 0 < used <= group")
            out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
        else:
            out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Compact cpulist syntax, the inverse of parse_cpulist: [0,1,2,3,8,9] -> "0-3,8-9"; [] -> ""."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------- dataclasses

@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as this process sees it.

    cpus:       CPUs of the node this process may run on (node cpulist ∩ allowed CPUs), sorted.
    all_cpus:   the node's CPUs as sysfs lists them, whether allowed or not.
    cores:      `cpus` grouped by physical core (SMT siblings together), ordered by the first
                CPU of each core. Without sibling information every CPU is its own core.
    mem_allowed: the node is in Mems_allowed (cpuset); has_memory: the node has memory at all.
    """
    id: int
    cpus: tuple[int, ...]
    all_cpus: tuple[int, ...] = ()
    cores: tuple[tuple[int, ...], ...] = ()
    mem_allowed: bool = True
    has_memory: bool = True
    mem_total_kb: int | None = None
    mem_available_kb: int | None = None   # MemFree + Inactive(file) at discovery (fastsac.machine.memory_available)
    distances: tuple[int, ...] = ()

    @property
    def usable(self) -> bool:
        """A process can be bound here: it may run on some of its CPUs and allocate its memory."""
        return self.unusable_reason is None

    @property
    def unusable_reason(self) -> str | None:
        if not self.all_cpus:
            return "it has no CPUs (memory-only node)"
        if not self.cpus:
            return (f"none of its CPUs ({format_cpulist(self.all_cpus)}) are in this process's "
                    "allowed CPUs (cpuset/affinity)")
        if not self.has_memory:
            return "it has no memory (memory-less node), so --membind to it cannot work"
        if not self.mem_allowed:
            return "it is not in this process's Mems_allowed_list (cpuset)"
        return None

    @property
    def core_ordered_cpus(self) -> tuple[int, ...]:
        """`cpus` in core-major order: slicing this list contiguously hands out whole cores."""
        return tuple(c for core in (self.cores or tuple((c,) for c in self.cpus)) for c in core)

    def describe(self) -> str:
        text = f"node {self.id}: CPUs {format_cpulist(self.cpus) or '-'}"
        if self.all_cpus and self.cpus != self.all_cpus:
            text += f" (of {format_cpulist(self.all_cpus)})"
        if self.mem_total_kb is not None:
            text += f", {self.mem_total_kb // 1024} MiB"
        reason = self.unusable_reason
        return text + (f", unusable: {reason}" if reason else "")


@dataclass(frozen=True)
class GpuDevice:
    """An NVIDIA GPU found on the PCI bus. numa_node is -1 when firmware/VM/container hides it."""
    pci_bus_id: str
    numa_node: int


@dataclass(frozen=True)
class Topology:
    """The machine as this process may use it. See the module docstring for the invariants.

    gpus: the NVIDIA GPUs CUDA will see, in CUDA index order as far as sysfs can tell (PCI bus
          order filtered by CUDA_VISIBLE_DEVICES; exact when CUDA_DEVICE_ORDER=PCI_BUS_ID or the
          GPUs are identical). gpu_node: node of gpus[0] (or of the requested bus id), -1 unknown.
    numa_supported: the kernel exposes NUMA nodes in sysfs; False = one synthetic node 0.
    """
    nodes: tuple[NumaNode, ...]
    gpu_node: int = -1
    gpus: tuple[GpuDevice, ...] = ()
    allowed_cpus: tuple[int, ...] = ()
    numa_supported: bool = True
    sysfs_root: str = REAL_SYSFS
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def usable_nodes(self) -> tuple[NumaNode, ...]:
        return tuple(n for n in self.nodes if n.usable)

    @property
    def usable_node_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes if n.usable)

    def node(self, node_id: int) -> NumaNode:
        """The node with this id; KeyError if it does not exist."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def has_node(self, node_id: int) -> bool:
        return any(n.id == node_id for n in self.nodes)

    def gpu_node_for(self, device: str) -> int:
        """NUMA node of the GPU a device string ('cuda', 'cuda:1', 'auto', 'cpu') will use; -1 unknown.

        'cpu' has no GPU: -1. 'cuda:N' picks gpus[N] when sysfs shows that many GPUs.
        """
        if device == "cpu":
            return -1
        m = re.fullmatch(r"cuda:(\d+)", device)
        if m and int(m.group(1)) < len(self.gpus):
            node = self.gpus[int(m.group(1))].numa_node
            return node if self.has_node(node) else -1
        return self.gpu_node

    def describe(self) -> str:
        """Multi-line human summary (used by the plan printout and in error messages)."""
        kind = f"{len(self.nodes)} NUMA node(s)" if self.numa_supported else "no NUMA support (one node)"
        lines = [f"topology ({self.sysfs_root}): {kind}, GPU node "
                 f"{self.gpu_node if self.gpu_node >= 0 else 'unknown'}"]
        lines += ["  " + n.describe() for n in self.nodes]
        lines += ["  GPU " + g.pci_bus_id + f" on node {g.numa_node if g.numa_node >= 0 else 'unknown'}"
                  for g in self.gpus]
        return "\n".join(lines)


# --------------------------------------------------------------------------- discovery

def sysfs_root(explicit: str | os.PathLike | None = None) -> Path:
    """The sysfs root to read: `explicit`, else $FASTSAC_SYSFS_ROOT, else /sys."""
    return Path(explicit or os.environ.get(SYSFS_ROOT_ENV) or REAL_SYSFS)


def _is_real_root(root: Path) -> bool:
    try:
        return os.path.realpath(root) == os.path.realpath(REAL_SYSFS)
    except OSError:
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def read_proc_status_list(key: str, pid: int | str = "self") -> tuple[int, ...] | None:
    """A cpulist-valued line of /proc/<pid>/status (Cpus_allowed_list, Mems_allowed_list); None if absent."""
    text = _read(Path(f"/proc/{pid}/status"))
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return parse_cpulist(line.split(":", 1)[1])
    return None


def normalize_pci_bus_id(bus_id: str) -> str:
    """'00000000:3B:00.0' (nvidia-smi), '3b:00.0', '0000:3b:00.0' -> '0000:3b:00.0' (sysfs form)."""
    text = bus_id.strip().lower()
    m = re.fullmatch(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", text)
    if not m:
        raise ValueError(f"{bus_id!r} is not a PCI bus id like 0000:3b:00.0")
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def _int_file(path: Path, base: int = 10) -> int | None:
    text = _read(path)
    try:
        return int(text.strip(), base) if text is not None else None
    except ValueError:
        return None


def _nvidia_gpus(root: Path) -> list[GpuDevice]:
    """NVIDIA display/3D controllers on the PCI bus, in bus-id order (= nvidia-smi order)."""
    pci = root / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(pci))
    except OSError:
        return []
    gpus = []
    for name in entries:
        dev = pci / name
        vendor = _int_file(dev / "vendor", 16)
        cls = _int_file(dev / "class", 16)
        if vendor != NVIDIA_VENDOR or cls is None or cls >> 16 != PCI_CLASS_DISPLAY:
            continue
        node = _int_file(dev / "numa_node")
        gpus.append(GpuDevice(pci_bus_id=name, numa_node=node if node is not None else -1))
    return gpus


def _visible_gpus(gpus: list[GpuDevice], cuda_visible: str | None, notes: list[str]) -> list[GpuDevice]:
    """Apply CUDA_VISIBLE_DEVICES the way the CUDA runtime does, as far as sysfs can tell.

    Integer indices select from the PCI-ordered list; like CUDA, parsing stops at the first
    invalid entry. UUIDs (GPU-..., MIG-...) cannot be mapped to bus ids without NVML: then the
    answer is only trustworthy when every GPU sits on the same node (checked by the caller).
    """
    if cuda_visible is None:
        return gpus
    picked: list[GpuDevice] = []
    for tok in (t.strip() for t in cuda_visible.split(",")):
        if tok.isdigit() and int(tok) < len(gpus):
            picked.append(gpus[int(tok)])
            continue
        if tok.upper().startswith(("GPU-", "MIG-")):
            notes.append(f"CUDA_VISIBLE_DEVICES={cuda_visible!r} uses UUIDs, which sysfs cannot map to "
                         "PCI bus ids; the GPU's node is known only if all GPUs share one node")
            nodes = {g.numa_node for g in gpus}
            return gpus if len(nodes) == 1 else []
        break
    return picked


def _siblings(root: Path, cpu: int) -> tuple[int, ...] | None:
    topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
    for name in ("core_cpus_list", "thread_siblings_list"):  # the second is the pre-5.x name
        text = _read(topo / name)
        if text is not None:
            try:
                return parse_cpulist(text)
            except ValueError:
                return None
    return None


def _group_cores(root: Path, cpus: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Group `cpus` into physical cores (SMT siblings within `cpus`), ordered by first CPU.

    Why: Linux often numbers the second hyper-thread of core k as k+ncores. Handing out CPUs
    in plain numeric order would give two collectors the two halves of the same cores.
    """
    allowed = set(cpus)
    cores: dict[int, tuple[int, ...]] = {}
    for cpu in cpus:
        sib = tuple(c for c in (_siblings(root, cpu) or (cpu,)) if c in allowed) or (cpu,)
        if cpu not in sib:  # inconsistent sysfs: trust the CPU id over the sibling list
            sib = (cpu,)
        key = min(sib)
        if key not in cores:
            cores[key] = sib
    seen: set[int] = set()
    out = []
    for key in sorted(cores):
        core = tuple(c for c in cores[key] if c not in seen)
        seen.update(core)
        if core:
            out.append(core)
    return tuple(out)


def _node_meminfo_kb(path: Path) -> tuple[int | None, int | None]:
    """(MemTotal, MemFree + Inactive(file)) of a node's meminfo, kB; None where a line is missing."""
    text = _read(path) or ""
    values = {k: int(v) for k, v in re.findall(r"Node \d+ (\S+):\s+(\d+)\s*kB", text)}
    free, cache = values.get("MemFree"), values.get("Inactive(file)")
    return values.get("MemTotal"), (free + (cache or 0)) if free is not None else None


class _FromEnv:
    """Sentinel type: "read it from the environment" (distinct from None = "unset")."""
    def __repr__(self) -> str:
        return "FROM_ENV"


FROM_ENV = _FromEnv()


def discover_topology(sysfs: str | os.PathLike | None = None, *,
                      allowed_cpus: Iterable[int] | None = None,
                      mems_allowed: Iterable[int] | None = None,
                      gpu_pci_bus_id: str | None = None,
                      cuda_visible_devices: str | None | _FromEnv = FROM_ENV) -> Topology:
    """Read the machine's NUMA layout as this process may use it.

    sysfs:          root laid out like /sys; default $FASTSAC_SYSFS_ROOT, else /sys.
    allowed_cpus:   CPUs this process may use. None: os.sched_getaffinity(0) under the real /sys,
                    every CPU of the tree under a fake root.
    mems_allowed:   memory nodes this process may use. None: /proc/self/status Mems_allowed_list
                    under the real /sys, every node under a fake root.
    gpu_pci_bus_id: pick the learner's GPU by bus id (any of the usual spellings).
    cuda_visible_devices: default: $CUDA_VISIBLE_DEVICES under the real /sys, unset under a fake
                    root (so a developer's shell does not leak into dry runs); None = unset.

    Never raises for a missing or odd sysfs: what cannot be read becomes "unknown" plus a
    note in Topology.notes. A kernel without NUMA sysfs yields one node 0 with every allowed CPU.
    """
    root = sysfs_root(sysfs)
    real = _is_real_root(root)
    notes: list[str] = []
    if isinstance(cuda_visible_devices, _FromEnv):
        cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES") if real else None

    node_dir = root / "devices" / "system" / "node"
    node_ids: list[int] = []
    try:
        node_ids = sorted(int(d[4:]) for d in os.listdir(node_dir) if re.fullmatch(r"node\d+", d))
    except OSError:
        pass
    numa_supported = bool(node_ids)

    # Allowed CPUs: the cpuset/affinity limit. Under a fake root the tree is the whole machine.
    if allowed_cpus is not None:
        allowed = tuple(sorted(set(allowed_cpus)))
    elif real:
        allowed = tuple(sorted(os.sched_getaffinity(0)))
    else:
        allowed = None  # resolved below: every CPU of the fake tree

    node_cpus = _node_cpus(node_dir, node_ids, notes)
    if not numa_supported:
        # Non-NUMA kernel (CONFIG_NUMA=n) or a sysfs without node/: one node 0 holding every CPU.
        cpus = allowed if allowed is not None else _online_cpus(root)
        node_ids, node_cpus = [0], {0: tuple(cpus)}
        notes.append(f"no NUMA nodes in {node_dir}: one node 0 with all {len(cpus)} allowed CPUs")
    if allowed is None:
        allowed = tuple(sorted({c for cs in node_cpus.values() for c in cs}))
    allowed_set = set(allowed)

    if mems_allowed is not None:
        mems = set(mems_allowed)
    elif real and numa_supported:
        found = read_proc_status_list("Mems_allowed_list")
        mems = set(found) if found is not None else set(node_ids)
    else:
        mems = set(node_ids)

    has_mem_text = _read(node_dir / "has_memory") if numa_supported else None
    try:
        with_memory = set(parse_cpulist(has_mem_text)) if has_mem_text is not None else set(node_ids)
    except ValueError:
        with_memory = set(node_ids)

    nodes = []
    for nid in node_ids:
        usable_cpus = tuple(c for c in node_cpus[nid] if c in allowed_set)
        meminfo = _node_meminfo_kb(node_dir / f"node{nid}" / "meminfo") if numa_supported else (None, None)
        nodes.append(NumaNode(
            id=nid, cpus=usable_cpus, all_cpus=node_cpus[nid],
            cores=_group_cores(root, usable_cpus),
            mem_allowed=nid in mems, has_memory=nid in with_memory,
            mem_total_kb=meminfo[0], mem_available_kb=meminfo[1],
            distances=_distances(node_dir, nid) if numa_supported else ()))
    all_gpus = _nvidia_gpus(root)
    gpus = _visible_gpus(all_gpus, cuda_visible_devices, notes)
    return Topology(nodes=tuple(nodes), gpu_node=_gpu_node(all_gpus, gpus, gpu_pci_bus_id, node_ids, notes),
                    gpus=tuple(gpus), allowed_cpus=allowed, numa_supported=numa_supported, sysfs_root=str(root),
                    notes=tuple(notes))


def _node_cpus(node_dir: Path, node_ids: list[int], notes: list[str]) -> dict[int, tuple[int, ...]]:
    out: dict[int, tuple[int, ...]] = {}
    for nid in node_ids:
        text = _read(node_dir / f"node{nid}" / "cpulist")
        try:
            out[nid] = parse_cpulist(text or "")
        except ValueError as exc:
            notes.append(f"node {nid}: unreadable cpulist ({exc}); treated as no CPUs")
            out[nid] = ()
    return out


def _online_cpus(root: Path) -> tuple[int, ...]:
    """Every online CPU of a tree without NUMA nodes (else this process's affinity)."""
    online = _read(root / "devices" / "system" / "cpu" / "online")
    try:
        cpus = parse_cpulist(online) if online else ()
    except ValueError:
        cpus = ()
    return cpus or tuple(sorted(os.sched_getaffinity(0)))


def _distances(node_dir: Path, nid: int) -> tuple[int, ...]:
    text = _read(node_dir / f"node{nid}" / "distance")
    try:
        return tuple(int(x) for x in text.split()) if text else ()
    except ValueError:
        return ()


def _gpu_node(all_gpus: list[GpuDevice], gpus: list[GpuDevice], gpu_pci_bus_id: str | None, node_ids,
              notes: list[str]) -> int:
    """The chosen GPU's node (the first visible one, or the one named by bus id); -1 unknown."""
    gpu_node = -1
    chosen: GpuDevice | None = gpus[0] if gpus else None
    if gpu_pci_bus_id:
        try:
            want = normalize_pci_bus_id(gpu_pci_bus_id)
        except ValueError as exc:
            want = None
            notes.append(str(exc))
        chosen = next((g for g in all_gpus if normalize_pci_bus_id(g.pci_bus_id) == want), None)
        if want and chosen is None:
            notes.append(f"GPU {want} not found among NVIDIA PCI devices "
                         f"({', '.join(g.pci_bus_id for g in all_gpus) or 'none'})")
    if not all_gpus:
        notes.append("no NVIDIA GPU on the PCI bus: GPU node unknown")
    elif chosen is not None:
        if chosen.numa_node < 0:
            notes.append(f"GPU {chosen.pci_bus_id} reports numa_node -1 (hidden by firmware, VM or "
                         "container): GPU node unknown")
        elif chosen.numa_node not in node_ids:
            notes.append(f"GPU {chosen.pci_bus_id} reports numa_node {chosen.numa_node}, which is "
                         "not a node of this machine: GPU node unknown")
        else:
            gpu_node = chosen.numa_node
    return gpu_node
