"""Real-kernel NUMA probe: run inside the 2-node guest, torch-free and numpy-free.

    .venv/bin/python tools/numa-vm/numa_vm.py run -- .venv/bin/python tests/support/numa_vm_probe.py

(tests/process/machine/test_numa_vm.py runs it so.)

Checks, on a real kernel with >= 2 NUMA nodes:
  1. discover_topology() sees every node and the CPUs this process may use.
  2. plan_job() for 2 spread collectors with numactl; each planned command prefix (numactl
     ... python) really binds: read from outside via /proc/<pid> (Cpus_allowed_list +
     numa_maps policy) and verified against the plan; a /dev/shm segment first-touched by the
     child lands on the planned node (numa_maps N<node>=pages).
  3. the same with numa_binding: inprocess (argv --bind-node/--bind-cpus, bind_from_argv()
     called by the child before anything heavy); the child starts a thread *before* binding
     to prove the re-pin; read back both from inside (syscalls) and from outside (/proc).
  4. a cgroup v2 cpuset (all CPUs, mems = last node): discovery inside it reads
     Mems_allowed_list, marks the other nodes unusable saying so, and the plan places the
     collector and the learner on the allowed node.
Prints PASS/FAIL lines and exits 1 on any failure; a skip (< 2 nodes) exits 0 with SKIP.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from fastsac.machine.binding import numa_maps_pages, read_binding, verify_binding  # noqa: E402
from fastsac.config import Config  # noqa: E402  (Config() directly: no validation, no numpy import)
from fastsac.machine.plan import plan_job  # noqa: E402
from fastsac.machine.plan_output import format_plan  # noqa: E402
from fastsac.machine.topology import discover_topology, format_cpulist  # noqa: E402

SEG_BYTES = 4 << 20
CHILD = r"""
import os, sys, mmap, json, threading
t = None
if "--pre-thread" in sys.argv:     # a thread that exists before binding (like an OpenBLAS pool)
    ev = threading.Event(); t = threading.Thread(target=ev.wait, daemon=True); t.start()
from fastsac.machine.binding import bind_from_argv, read_binding
res = bind_from_argv()
path = f"/dev/shm/fastsac.probe.{os.getpid()}"
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, SIZE)
m = mmap.mmap(fd, SIZE)
m.write(b"\1" * SIZE)               # first touch, under this process's policy
eff = read_binding()
print(json.dumps({"pid": os.getpid(), "path": path, "cpus": eff.cpus, "policy": eff.mempolicy,
                  "nodes": eff.mem_nodes, "repinned": list(res.repinned_threads) if res else None,
                  "thread_cpus": sorted(os.sched_getaffinity(t.native_id)) if t else None}), flush=True)
sys.stdin.readline()
os.unlink(path)
""".replace("SIZE", str(SEG_BYTES))

CGROUP_CHILD = r"""
import json
from fastsac.config import Config
from fastsac.machine.plan import plan_job
from fastsac.machine.topology import discover_topology
t = discover_topology()
c = Config(); c.trainer.async_options.numa_binding = "inprocess"
c.env.num_envs = 8
p = plan_job(c, t, "job.yaml", [])
print(json.dumps({"usable": t.usable_node_ids, "allowed": t.allowed_cpus,
                  "reasons": {n.id: n.unusable_reason for n in t.nodes},
                  "plan_nodes": [x.node for x in p.collectors], "plan_cpus": [x.cpus for x in p.collectors],
                  "learner": [p.learner.node, p.learner.cpus]}), flush=True)
"""

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


def start_children(plan, extra: list[str]) -> list[tuple]:
    """Start one probe child per collector with the plan's own prefix/binding args."""
    procs = []
    for col in plan.collectors:
        argv = list(col.argv)
        i = argv.index("-m")   # keep `numactl ... python`; swap the module for the probe body
        j = argv.index("--bind-node") if "--bind-node" in argv else len(argv)
        bind = argv[j:j + 4]   # inprocess: --bind-node N --bind-cpus L, adjacent by construction
        cmd = argv[:i] + ["-c", CHILD, *bind, *extra]
        env = dict(child_env(), **col.env_dict)
        procs.append((col, subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, env=env)))
    return procs


def inspect_children(procs, label: str) -> None:
    for col, proc in procs:
        line = proc.stdout.readline()
        if not line:
            check(False, f"{label} collector {col.collector_id}: child died: {proc.stderr.read().strip()}")
            continue
        inside = json.loads(line)
        outside = read_binding(proc.pid)
        pages = numa_maps_pages(proc.pid, inside["path"])
        print(f"  {label} collector {col.collector_id}: planned node {col.node} CPUs {col.cpulist}; "
              f"inside: CPUs {format_cpulist(inside['cpus'])} policy {inside['policy']}:{inside['nodes']}; "
              f"outside: {outside.describe()}; shm pages per node {pages}", flush=True)
        try:
            verify_binding(col.node, col.cpus, pid=proc.pid, effective=outside)
            verify_binding(col.node, col.cpus, effective=type(outside)(
                pid=proc.pid, cpus=tuple(inside["cpus"]), mempolicy=inside["policy"], mem_nodes=tuple(inside["nodes"])))
            check(True, f"{label} collector {col.collector_id}: bound to node {col.node} CPUs {col.cpulist} "
                        "(inside and via /proc)")
        except Exception as exc:  # noqa: BLE001 - report every failure, keep probing
            check(False, f"{label} collector {col.collector_id}: {exc}")
        want = SEG_BYTES // os.sysconf("SC_PAGE_SIZE")
        check(pages == {col.node: want}, f"{label} collector {col.collector_id}: segment first-touched on node "
                                         f"{col.node}: numa_maps {pages}, expected {{{col.node}: {want}}}")
        if inside["thread_cpus"] is not None:
            check(inside["thread_cpus"] == list(col.cpus) and len(inside["repinned"]) == 1,
                  f"{label} collector {col.collector_id}: thread started before binding re-pinned to "
                  f"{inside['thread_cpus']} (repinned tids {inside['repinned']})")
    for _, proc in procs:
        if proc.poll() is None:
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=120)


def main() -> int:
    topo = discover_topology()
    print(topo.describe(), flush=True)
    in_guest = os.environ.get("NUMA_VM_GUEST") == "1"
    min_nodes = int(os.environ.get("PROBE_MIN_NODES", "2"))   # 1: smoke-run the probe itself on a 1-node host
    if len(topo.usable_nodes) < min_nodes:
        print(f"SKIP: needs >= 2 usable NUMA nodes, found {topo.usable_node_ids}")
        return 0
    check(all(n.cpus for n in topo.nodes), "every node has CPUs this process may use")
    if shutil.which("numactl"):
        print(subprocess.run(["numactl", "--hardware"], capture_output=True, text=True).stdout, flush=True)

    cfg = Config()
    ao = cfg.trainer.async_options
    ao.num_collectors, cfg.env.num_envs = len(topo.usable_nodes), 8
    running = []
    numactl = shutil.which("numactl")
    if numactl:
        ao.numa_binding = "numactl"
        plan = plan_job(cfg, topo, "job.yaml", [])
        print(format_plan(plan), flush=True)
        running.append((plan, start_children(plan, []), "numactl"))
    else:
        check(False, "numactl is not installed in the guest")
    ao.numa_binding = "inprocess"
    plan_ip = plan_job(cfg, topo, "job.yaml", [])
    print(format_plan(plan_ip), flush=True)
    running.append((plan_ip, start_children(plan_ip, ["--pre-thread"]), "inprocess"))

    cgroup = Path(f"/sys/fs/cgroup/fastsac_probe_{os.getpid()}")
    cg_proc = None
    last_node = topo.usable_nodes[-1]
    try:
        if not in_guest:   # never touch a real host's cgroups
            raise OSError("not in the NUMA VM guest (NUMA_VM_GUEST unset)")
        Path("/sys/fs/cgroup/cgroup.subtree_control").write_text("+cpuset")
        cgroup.mkdir(exist_ok=True)
        # every CPU stays allowed: only Mems_allowed makes the other nodes unusable here
        (cgroup / "cpuset.cpus").write_text(format_cpulist(topo.allowed_cpus))
        (cgroup / "cpuset.mems").write_text(str(last_node.id))
        procs_file = str(cgroup / "cgroup.procs")
        cg_proc = subprocess.Popen([sys.executable, "-c", CGROUP_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=child_env(),
                                   preexec_fn=lambda: Path(procs_file).write_text(str(os.getpid())))
    except OSError as exc:
        print(f"SKIP cgroup check: {exc}")

    for plan, procs, label in running:
        inspect_children(procs, label)

    if cg_proc is not None:
        out, err = cg_proc.communicate(timeout=300)
        if cg_proc.returncode != 0:
            check(False, f"cgroup child failed: {err.strip()}")
        else:
            r = json.loads(out.strip().splitlines()[-1])
            print(f"  cgroup cpuset cpus={format_cpulist(topo.allowed_cpus)} mems={last_node.id}: {r}", flush=True)
            others = [k for k in r["reasons"] if int(k) != last_node.id]
            check(r["usable"] == [last_node.id] and r["allowed"] == list(topo.allowed_cpus)
                  and all("Mems_allowed_list" in r["reasons"][k] for k in others)
                  and r["plan_nodes"] == [last_node.id] and r["learner"][0] == last_node.id,
                  f"inside a cpuset only node {last_node.id} is usable and the plan puts everything there")
        try:
            cgroup.rmdir()
        except OSError:
            pass

    print(f"{'FAILED' if failures else 'ALL PASSED'}: {len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
