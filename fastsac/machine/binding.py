"""Bind the calling process to a NUMA node (CPUs + memory policy) and read bindings back.

Torch-free and numpy-free, ctypes only (no libnuma dependency): a collector or learner started
with `--bind-node N --bind-cpus L` (numa_binding: inprocess) calls `bind_from_argv()` as its
very first statement, before `import torch` / `import numpy`, for two reasons:
  * the memory policy is per *thread* and is inherited at thread creation: threads that exist
    before binding (OpenMP/OpenBLAS pools started at import) keep the default policy forever;
    no syscall can change another thread's policy. Their CPU affinity can be fixed (we re-pin
    every tid in /proc/self/task), their memory policy cannot.
  * a page lands on a node at *first touch*, under the policy of the touching thread. Memory
    touched before binding stays where it landed (a few MB of interpreter start-up: harmless;
    a shared-memory ring: not harmless, so first-touch segments only after binding).
`numactl --cpunodebind=N --membind=N` has neither problem: it binds before the interpreter
starts. That is why numa_binding: auto prefers numactl when it is installed.

Read-back (for the plan's verification and the NUMA checks):
  * own process: sched_getaffinity + get_mempolicy (the calling thread's policy);
  * another pid: /proc/<pid>/status Cpus_allowed_list + the policy column of
    /proc/<pid>/numa_maps (the task policy shows on every mapping without its own mbind policy).
  Note: Mems_allowed_list is the cpuset limit, not the policy; `numactl --membind` leaves it
  unchanged. It is reported as `mems_allowed`, never used as "the binding".
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from fastsac.machine.topology import format_cpulist, parse_cpulist, read_proc_status_list

__all__ = [
    "BindingError", "EffectiveBinding", "BindResult", "NumaMapping",
    "bind_self", "bind_from_argv", "read_binding", "verify_binding", "thread_env",
    "parse_numa_maps", "numa_maps_pages", "numa_maps_bytes", "THREAD_ENV_VARS",
]


class BindingError(RuntimeError):
    """Binding could not be applied, or the effective binding differs from the plan."""


# --------------------------------------------------------------------------- syscalls

# (mbind, set_mempolicy, get_mempolicy). glibc exports none of them (libnuma does), so we go
# through syscall(2). riscv64 uses the asm-generic table like aarch64.
_SYSCALLS = {
    "x86_64": (237, 238, 239),
    "aarch64": (235, 237, 236),
    "arm64": (235, 237, 236),
    "riscv64": (235, 237, 236),
}

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE = 5, 6
_MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)  # STATIC_NODES | RELATIVE_NODES | NUMA_BALANCING
_MODE_NAMES = {
    MPOL_DEFAULT: "default", MPOL_PREFERRED: "preferred", MPOL_BIND: "bind",
    MPOL_INTERLEAVE: "interleave", MPOL_LOCAL: "local", MPOL_PREFERRED_MANY: "preferred_many",
    MPOL_WEIGHTED_INTERLEAVE: "weighted_interleave",
}
# numa_maps spells modes as the kernel's policy_modes[] table does.
_NUMA_MAPS_MODES = {
    "default": "default", "prefer": "preferred", "bind": "bind", "interleave": "interleave",
    "local": "local", "prefer (many)": "preferred_many", "weighted interleave": "weighted_interleave",
}

# Node mask size in bits. The kernel rejects get_mempolicy with maxnode < nr_node_ids and any
# mask > one page; 1024 = MAX_NUMNODES of the largest x86/arm64 configs (NODES_SHIFT=10).
_MASK_BITS = 1024
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
_NodeMask = ctypes.c_ulong * (_MASK_BITS // _ULONG_BITS)

_libc = None


def _syscall_numbers() -> tuple[int, int, int]:
    machine = platform.machine().lower()
    if machine not in _SYSCALLS:
        raise BindingError(f"in-process memory binding does not know the syscall numbers for {machine!r} "
                           f"(known: {', '.join(sorted(_SYSCALLS))}); use numa_binding: numactl")
    return _SYSCALLS[machine]


def _syscall(number: int, *args) -> tuple[int, int]:
    """syscall(2) -> (return value, errno)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(number), *args)
    return ret, ctypes.get_errno()


def _set_mempolicy(mode: int, nodes: Iterable[int]) -> None:
    mask = _NodeMask()
    for n in nodes:
        if not 0 <= n < _MASK_BITS:
            raise BindingError(f"NUMA node {n} is outside 0..{_MASK_BITS - 1}")
        mask[n // _ULONG_BITS] |= 1 << (n % _ULONG_BITS)
    # maxnode is "bits + 1": the kernel has read one bit less than maxnode since 2.6 (libnuma
    # and numactl pass size + 1 too).
    ret, err = _syscall(_syscall_numbers()[1], ctypes.c_int(mode), mask, ctypes.c_ulong(_MASK_BITS + 1))
    if ret != 0:
        raise OSError(err, os.strerror(err))


def _get_mempolicy() -> tuple[str, tuple[int, ...]]:
    """The calling thread's policy: (mode name, nodes). Raises OSError."""
    mode = ctypes.c_int(0)
    mask = _NodeMask()
    ret, err = _syscall(_syscall_numbers()[2], ctypes.byref(mode), mask, ctypes.c_ulong(_MASK_BITS + 1),
                        ctypes.c_void_p(None), ctypes.c_ulong(0))
    if ret != 0:
        raise OSError(err, os.strerror(err))
    nodes = tuple(i for i in range(_MASK_BITS) if mask[i // _ULONG_BITS] >> (i % _ULONG_BITS) & 1)
    value = mode.value & ~_MPOL_MODE_FLAGS
    return _MODE_NAMES.get(value, f"mode{value}"), nodes


# --------------------------------------------------------------------------- read-back

@dataclass(frozen=True)
class EffectiveBinding:
    """What the kernel says a process is bound to.

    cpus:        CPU affinity (sched_getaffinity, or Cpus_allowed_list for another pid).
    mempolicy:   'default' | 'bind' | 'preferred' | 'interleave' | 'local' | 'preferred_many' |
                 'weighted_interleave'; 'unsupported' on a kernel without NUMA;
                 'unknown' when it could not be read (e.g. numa_maps not readable).
    mem_nodes:   nodes of the policy (empty for default/local).
    mems_allowed: the cpuset's Mems_allowed_list (a limit, not the policy), () if unknown.
    source:      'syscall' (own thread) or '/proc/<pid>'.
    """
    pid: int
    cpus: tuple[int, ...]
    mempolicy: str
    mem_nodes: tuple[int, ...]
    mems_allowed: tuple[int, ...] = ()
    source: str = "syscall"

    def describe(self) -> str:
        policy = self.mempolicy + (f":{format_cpulist(self.mem_nodes)}" if self.mem_nodes else "")
        return (f"pid {self.pid}: CPUs {format_cpulist(self.cpus)}, memory policy {policy}"
                f" (Mems_allowed {format_cpulist(self.mems_allowed) or '?'}, via {self.source})")


def read_binding(pid: int | None = None) -> EffectiveBinding:
    """The effective CPU affinity and memory policy of this thread (pid None) or of `pid`.

    For pid None the answer is the *calling thread's*, straight from the kernel. For a pid it is
    the main thread's affinity and the task policy as numa_maps prints it. Raises BindingError
    if the process does not exist.
    """
    if pid is None:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
        try:
            mode, nodes = _get_mempolicy()
        except OSError as exc:
            if exc.errno == errno.ENOSYS:
                mode, nodes = "unsupported", ()
            else:  # e.g. EPERM from a container seccomp profile: fall back to numa_maps
                mode, nodes = _policy_from_numa_maps("self")
        except BindingError:  # unknown architecture
            mode, nodes = _policy_from_numa_maps("self")
        mems = read_proc_status_list("Mems_allowed_list", "self") or ()
        return EffectiveBinding(pid=os.getpid(), cpus=cpus, mempolicy=mode, mem_nodes=nodes, mems_allowed=mems,
                                source="syscall")
    cpus = read_proc_status_list("Cpus_allowed_list", pid)
    if cpus is None:
        raise BindingError(f"cannot read /proc/{pid}/status: no such process (or not readable)")
    mode, nodes = _policy_from_numa_maps(pid)
    mems = read_proc_status_list("Mems_allowed_list", pid) or ()
    return EffectiveBinding(pid=pid, cpus=cpus, mempolicy=mode, mem_nodes=nodes, mems_allowed=mems,
                            source=f"/proc/{pid}")


def _policy_from_numa_maps(pid: int | str) -> tuple[str, tuple[int, ...]]:
    """Task policy from numa_maps: the [stack] mapping's, else the most common one.

    Why the stack: it never carries its own mbind policy, so it shows the task policy.
    """
    path = f"/proc/{pid}/numa_maps"
    if not os.path.exists(path):
        return ("unsupported", ()) if os.path.exists(f"/proc/{pid}") else ("unknown", ())
    try:
        with open(path) as f:
            maps = parse_numa_maps(f.read())
    except OSError:
        return "unknown", ()
    if not maps:
        return "unknown", ()
    stack = [m for m in maps if m.kind == "stack"]
    if stack:
        return stack[0].policy, stack[0].policy_nodes
    (mode, nodes), _ = Counter((m.policy, m.policy_nodes) for m in maps).most_common(1)[0]
    return mode, nodes


def verify_binding(expected_node: int, expected_cpus: Iterable[int], pid: int | None = None,
                   *, effective: EffectiveBinding | None = None) -> EffectiveBinding:
    """Raise BindingError unless `pid` (None = this thread) runs on exactly `expected_cpus` with
    memory bound to exactly `expected_node`. Returns the effective binding on success.

    A kernel without NUMA support ('unsupported') passes the memory check for node 0: there is
    only one node, so every page is on it.
    """
    eff = effective if effective is not None else read_binding(pid)
    want = tuple(sorted(set(expected_cpus)))
    problems = []
    if eff.cpus != want:
        missing = sorted(set(want) - set(eff.cpus))
        extra = sorted(set(eff.cpus) - set(want))
        detail = "; ".join(x for x in (f"missing {format_cpulist(missing)}" if missing else "",
                                        f"unexpected {format_cpulist(extra)}" if extra else "") if x)
        problems.append(f"CPU affinity is {format_cpulist(eff.cpus) or 'empty'} but the plan says "
                        f"{format_cpulist(want)} ({detail})")
    if eff.mempolicy == "unsupported" and expected_node == 0:
        pass
    elif eff.mempolicy != "bind" or eff.mem_nodes != (expected_node,):
        got = eff.mempolicy + (f":{format_cpulist(eff.mem_nodes)}" if eff.mem_nodes else "")
        why = (" (no binding: pages land on whichever node the touching thread runs on)"
               if eff.mempolicy in ("default", "local") else "")
        problems.append(f"memory policy is {got}{why} but the plan says bind:{expected_node}")
    if problems:
        who = "this process" if pid is None else f"pid {pid}"
        raise BindingError(f"{who} is not bound as planned (node {expected_node}, CPUs "
                           f"{format_cpulist(want)}): " + "; ".join(problems))
    return eff


# --------------------------------------------------------------------------- binding

@dataclass(frozen=True)
class BindResult:
    """Outcome of bind_self.

    repinned_threads: other threads of this process that existed before binding; their CPU
    affinity was moved to `cpus`, but their memory policy is still whatever it was (see the
    module docstring). Empty when bind_self ran first thing, as it should.
    """
    node: int
    cpus: tuple[int, ...]
    effective: EffectiveBinding
    repinned_threads: tuple[int, ...] = ()


def _task_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def bind_self(node: int, cpus: Sequence[int], *, verify: bool = True) -> BindResult:
    """Bind this process: CPU affinity to `cpus` and memory policy MPOL_BIND to `node`.

    Call it from the main thread, first thing in the process, before importing torch/numpy.
    Order: memory policy first (so nothing this thread allocates from here on lands
    elsewhere), then affinity of this thread, then of every other existing thread (re-listed
    until no new thread appears, since a pool may be spawning while we pin).
    With verify=True (default) the result is read back and a BindingError raised if the
    kernel silently narrowed it (e.g. a cpuset that allows only some of `cpus`).
    """
    cpu_set = sorted(set(int(c) for c in cpus))
    if node < 0:
        raise BindingError(f"cannot bind to NUMA node {node}: node ids are >= 0")
    if not cpu_set:
        raise BindingError(f"cannot bind to node {node} with an empty CPU list")
    if threading.current_thread() is not threading.main_thread():
        raise BindingError("bind_self must run on the main thread: the memory policy it sets is per thread, "
                           "and only threads created afterwards inherit it")

    try:
        _set_mempolicy(MPOL_BIND, [node])
    except OSError as exc:
        if exc.errno == errno.ENOSYS and node == 0:
            pass  # kernel without NUMA: one node, nothing to bind
        elif exc.errno == errno.ENOSYS:
            raise BindingError(f"cannot bind memory to node {node}: this kernel has no NUMA support "
                               "(set_mempolicy: ENOSYS), so only node 0 exists") from None
        elif exc.errno == errno.EINVAL:
            allowed = read_proc_status_list("Mems_allowed_list", "self")
            raise BindingError(
                f"set_mempolicy(MPOL_BIND, node {node}) failed: EINVAL: node {node} does not exist, has no "
                f"memory or is outside this process's Mems_allowed_list "
                f"({format_cpulist(allowed) if allowed else 'unknown'})") from None
        elif exc.errno == errno.EPERM:
            raise BindingError(
                f"set_mempolicy(MPOL_BIND, node {node}) failed: EPERM: a seccomp profile blocks it (Docker's "
                "default one allows it only with --cap-add SYS_NICE); numactl --membind fails the same way. "
                "Run with SYS_NICE or use numa_binding: off") from None
        else:
            raise BindingError(f"set_mempolicy(MPOL_BIND, node {node}) failed: {exc}") from None

    me = threading.get_native_id()
    try:
        os.sched_setaffinity(0, cpu_set)
    except OSError as exc:
        allowed = sorted(os.sched_getaffinity(0))
        raise BindingError(f"sched_setaffinity to CPUs {format_cpulist(cpu_set)} failed ({exc.strerror}); this "
                           f"process may use CPUs {format_cpulist(allowed)} (cpuset/affinity)") from None

    repinned: set[int] = set()
    for _ in range(10):  # a pool spawning threads while we pin: re-list until stable
        todo = _task_ids() - repinned - {me}
        if not todo:
            break
        for tid in todo:
            try:
                os.sched_setaffinity(tid, cpu_set)
            except (ProcessLookupError, PermissionError):
                pass  # the thread exited meanwhile
            repinned.add(tid)

    effective = read_binding()
    if verify:
        verify_binding(node, cpu_set, effective=effective)
    return BindResult(node=node, cpus=tuple(cpu_set), effective=effective,
                      repinned_threads=tuple(sorted(t for t in repinned if t in _task_ids())))


def bind_from_argv(argv: Sequence[str] | None = None) -> BindResult | None:
    """Apply `--bind-node N --bind-cpus LIST` from argv (default sys.argv); None if absent.

    Meant as the first statement of fastsac.collector_main / learner_main, before any heavy
    import. It only reads argv; the entry point's own argparse must still accept both options.
    Both or neither must be given. Raises BindingError on bad values or a failed binding.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    found: dict[str, str] = {}
    for i, a in enumerate(args):
        for opt in ("--bind-node", "--bind-cpus"):
            if a == opt and i + 1 < len(args):
                found[opt] = args[i + 1]
            elif a.startswith(opt + "="):
                found[opt] = a.split("=", 1)[1]
    if not found:
        return None
    if len(found) != 2:
        raise BindingError("--bind-node and --bind-cpus go together; got only " + ", ".join(found))
    try:
        node = int(found["--bind-node"])
        cpus = parse_cpulist(found["--bind-cpus"])
    except ValueError as exc:
        raise BindingError(f"bad --bind-node/--bind-cpus: {exc}") from None
    return bind_self(node, cpus)


# --------------------------------------------------------------------------- thread counts

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",        # OpenMP (torch intra-op on most builds, MuJoCo plugins, numexpr)
    "MKL_NUM_THREADS",        # Intel MKL (torch CPU builds, numpy from conda)
    "OPENBLAS_NUM_THREADS",   # numpy/scipy wheels: OpenBLAS starts this many threads at import
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",  # macOS Accelerate
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
)


def thread_env(num_cpus: int) -> dict[str, str]:
    """Environment for a child bound to `num_cpus` CPUs: every thread pool sized to its CPUs.

    Why: each pool otherwise sizes itself to the machine (or to the affinity at import), and N
    processes x M threads on M CPUs silently halves throughput (TorchRL #1325). The process
    should still call torch.set_num_threads(len(own CPUs)) after importing torch.
    """
    if num_cpus < 1:
        raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
    return {name: str(num_cpus) for name in THREAD_ENV_VARS}


# --------------------------------------------------------------------------- numa_maps

@dataclass(frozen=True)
class NumaMapping:
    """One line of /proc/<pid>/numa_maps.

    node_pages: pages per node, in units of page_kb (the mapping's kernelpagesize_kB: 4 for
    normal pages, 2048 for 2 MiB huge pages). kind: 'file', 'heap', 'stack', 'huge' or 'anon'.
    """
    address: int
    policy: str
    policy_nodes: tuple[int, ...]
    file: str | None
    kind: str
    node_pages: tuple[tuple[int, int], ...]
    page_kb: int

    @property
    def node_bytes(self) -> dict[int, int]:
        return {n: p * self.page_kb * 1024 for n, p in self.node_pages}


_POLICY_RE = re.compile(
    r"^(default|prefer \(many\)|weighted interleave|prefer|bind|interleave|local)(=[a-z|]+)?(?::(\S+))?(?=\s|$)")


def _unescape(path: str) -> str:
    # The kernel prints file paths with space, tab, newline and '=' as octal escapes (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def parse_numa_maps(text: str) -> list[NumaMapping]:
    """Parse numa_maps text. Lines that do not parse are skipped (the format only grows fields)."""
    out = []
    for line in text.splitlines():
        addr, _, rest = line.strip().partition(" ")
        try:
            address = int(addr, 16)
        except ValueError:
            continue
        m = _POLICY_RE.match(rest)
        if m:
            policy = _NUMA_MAPS_MODES[m.group(1)]
            try:
                nodes = parse_cpulist(m.group(3) or "")
            except ValueError:
                nodes = ()
            rest = rest[m.end():]
        else:  # a mode this parser does not know: keep its word, no nodes
            word, _, rest = rest.partition(" ")
            policy, nodes = word.split(":")[0], ()
        file, kind, pages, page_kb = None, "anon", [], 4
        for tok in rest.split():
            key, eq, value = tok.partition("=")
            if not eq:
                if tok in ("heap", "stack", "huge"):
                    kind = tok
                continue
            if key == "file":
                file, kind = _unescape(value), "file"
            elif key == "kernelpagesize_kB":
                page_kb = int(value) if value.isdigit() else page_kb
            elif key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                pages.append((int(key[1:]), int(value)))
        out.append(NumaMapping(address=address, policy=policy, policy_nodes=nodes, file=file, kind=kind,
                               node_pages=tuple(pages), page_kb=page_kb))
    return out


def _read_numa_maps(pid: int | None) -> list[NumaMapping]:
    path = f"/proc/{'self' if pid is None else pid}/numa_maps"
    try:
        with open(path) as f:
            return parse_numa_maps(f.read())
    except FileNotFoundError:
        raise BindingError(f"{path} does not exist (no such process, or a kernel without NUMA)") from None
    except OSError as exc:
        raise BindingError(f"cannot read {path}: {exc.strerror}") from None


def numa_maps_bytes(pid: int | None, path_substring: str, *, text: str | None = None) -> dict[int, int]:
    """Resident bytes per node of the mappings whose file path contains `path_substring`.

    pid None = this process; `text` parses that numa_maps text instead of reading /proc.
    Nodes with no pages are absent. A segment mapped twice is counted twice.
    """
    maps = parse_numa_maps(text) if text is not None else _read_numa_maps(pid)
    out: dict[int, int] = {}
    for m in maps:
        if m.file is not None and path_substring in m.file:
            for node, nbytes in m.node_bytes.items():
                out[node] = out.get(node, 0) + nbytes
    return out


def numa_maps_pages(pid: int | None, path_substring: str, *, text: str | None = None,
                    page_size: int | None = None) -> dict[int, int]:
    """Resident pages per node of the mappings whose file path contains `path_substring`
    (e.g. '/dev/shm/fastsac.'), from /proc/<pid>/numa_maps (pid None = this process).

    numa_maps counts in each mapping's own page size (kernelpagesize_kB); the result is in
    units of `page_size` bytes (default: the base page size, os.sysconf('SC_PAGE_SIZE')), so
    a 2 MiB huge page counts as 512 base pages and mixed mappings add up correctly.
    """
    unit = page_size or os.sysconf("SC_PAGE_SIZE")
    return {n: b // unit for n, b in numa_maps_bytes(pid, path_substring, text=text).items()}
