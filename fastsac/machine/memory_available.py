"""How much memory a new job can still take on this machine (torch-free).

Three limits, the smallest wins:
  * the machine: /proc/meminfo MemAvailable (what the kernel can hand out without swapping);
  * this process's cgroup, which the job's processes inherit: v2 `memory.max - memory.current`,
    v1 `memory.limit_in_bytes - memory.usage_in_bytes` (a v1 "no limit" is a huge number);
  * per NUMA node, for processes bound there with --membind: the node's MemFree plus its
    Inactive(file) pages (clean page cache the kernel drops first; fastsac.machine.topology
    reads them), a conservative estimate: a bound process cannot spill to another node.
"""
from __future__ import annotations

import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_NO_LIMIT = 2**60     # v1 reports "unlimited" as PAGE_COUNTER_MAX pages in bytes (~2^63)


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(the v2 path, the v1 memory controller's path) of this process, from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_memory_left(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> tuple[int, str] | None:
    """(bytes this cgroup may still allocate, which file says so); None without a limit."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    v2, v1 = _cgroup_paths(proc_cgroup)
    if v1 is not None:
        d = root / "memory" / v1.lstrip("/")
        limit, usage = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
        if limit is not None and usage is not None and limit < V1_NO_LIMIT:
            return max(0, limit - usage), "the cgroup (v1) memory.limit_in_bytes - memory.usage_in_bytes"
    if v2 is not None:
        d = root / v2.lstrip("/")
        limit, usage = _read_int(d / "memory.max"), _read_int(d / "memory.current")   # "max": no limit
        if limit is not None and usage is not None:
            return max(0, limit - usage), "the cgroup's memory.max - memory.current"
    return None


def available_memory() -> tuple[int, str] | None:
    """(bytes a new allocation can get without swapping, where that number comes from)."""
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        m = None
    found = [(int(m.group(1)) * 1024, "/proc/meminfo MemAvailable")] if m else []
    left = cgroup_memory_left()
    if left is not None:
        found.append(left)
    return min(found) if found else None


# --------------------------------------------------------------------------- after the fact

def resident_bytes(pid: int) -> int | None:
    """A live process's resident memory (VmRSS), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def _counter(path: Path, name: str) -> int | None:
    try:
        m = re.search(rf"^{name}\s+(\d+)", path.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def oom_kill_counts(pid: int | str = "self", root: Path = CGROUP_ROOT) -> dict[str, int]:
    """The kernel's OOM-kill counters that cover process `pid`: system-wide (/proc/vmstat) and
    its cgroup's (v2 memory.events, v1 memory.oom_control). A counter that rose while a process
    ran, and the process died by SIGKILL, is the OOM killer's signature."""
    found = {}
    system = _counter(Path("/proc/vmstat"), "oom_kill")
    if system is not None:
        found["/proc/vmstat oom_kill"] = system
    try:
        v2, v1 = _cgroup_paths(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        v2 = v1 = None
    for path in ([root / v2.lstrip("/") / "memory.events"] if v2 is not None else []) + \
                ([root / "memory" / v1.lstrip("/") / "memory.oom_control"] if v1 is not None else []):
        count = _counter(path, "oom_kill")
        if count is not None:
            found[f"{path} oom_kill"] = count
    return found


def oom_evidence(before: dict[str, int], after: dict[str, int]) -> str | None:
    """'counter a -> b' for every OOM-kill counter that rose; None when none did."""
    rose = [f"{k} {before[k]} -> {after[k]}" for k in before if k in after and after[k] > before[k]]
    return "; ".join(rose) or None
