"""In-guest NUMA placement check of a real 2-collector job (`fastsac-launch CFG --check-numa`).

Runs INSIDE the 2-node guest of tools/numa-vm (tests/process/machine/test_numa_vm.py boots it), or on any
real machine with >= 2 NUMA nodes; not collected by pytest (no test_ prefix):

    .venv/bin/python tools/numa-vm/numa_vm.py run -- .venv/bin/python tests/support/numa_guest_check.py

For each binding method (numactl, then inprocess) it writes a job config (pendulum, 8 envs,
2 collectors, placement: spread, device cpu), runs `python -m fastsac.launcher CFG --check-numa`
(the launcher starts the real learner and collectors with their real binding; each binds,
creates/attaches and first-touches its segments, reports what /proc says and exits) and checks:
  * collector i: its CPUs are node i's CPUs (/sys/devices/system/node/node<i>/cpulist), its
    memory policy is bind:i, and every page of its ring and weight-snapshot segments is on
    node i (/proc/self/numa_maps: > 0 pages, no other node; all of the segment when the
    report carries the segment's size);
  * the learner: bound to its planned node and CPUs;
  * /dev/shm holds no fastsac segment afterwards.
With --negative-control it also launches with numa_binding: off and requires the collector CPU
and memory-policy checks to FAIL for those unbound collectors (the checks can catch a fault).
Torch-free and numpy-free itself (every Python start costs seconds under software emulation;
the launcher and its children import numpy, never torch: a fake `torch` package first on their
PYTHONPATH ends any process that imports torch, printing the import chain, so the check fails).

Prints one PASS/FAIL line per check, a `RESULT: PASS|FAIL` summary and one machine-readable
`NUMA-GUEST-RESULT {json}` line; exits 1 on any failure. Fewer than 2 NUMA nodes: SKIP
(exit 0) on a real machine, FAIL inside the VM (NUMA_VM_GUEST=1), where 2 nodes are expected.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHM_DIR = "/dev/shm"
NODE_DIR = Path("/sys/devices/system/node")
BINDINGS = ("numactl", "inprocess")
NUM_COLLECTORS = 2
RESULT_PREFIX = "NUMA-GUEST-RESULT "
LAUNCH_TIMEOUT_S = 210.0   # per launch; 2 launches + boot stay below the host test's NUMA_VM_TIMEOUT

CONFIG = """\
# written by tests/support/numa_guest_check.py
job_name: {job}
run_dir: {run_dir}
seed: 1
device: cpu
env:
  name: pendulum
  num_envs: 8
trainer:
  asynchronous: true
  async_options:
    num_collectors: {n}
    numa_binding: {binding}
    placement: spread
    collector_inference_device: cpu
"""

checks: list[tuple[bool, str, str]] = []   # (ok, what, key); key names the checks a control must fail


def check(ok: bool, what: str, key: str = "") -> bool:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    checks.append((bool(ok), what, key))
    return bool(ok)


def parse_cpulist(text: str) -> list[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def node_cpus() -> dict[int, list[int]]:
    """{node id: CPUs} of every node that has CPUs (sysfs; what the kernel really has)."""
    out = {}
    if NODE_DIR.is_dir():
        for d in NODE_DIR.iterdir():
            if d.name.startswith("node") and d.name[4:].isdigit():
                cpus = parse_cpulist((d / "cpulist").read_text())
                if cpus:
                    out[int(d.name[4:])] = cpus
    return dict(sorted(out.items()))


def shm_segments(prefix: str = "fastsac.") -> list[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


TRIPWIRE = """\
import os, sys, traceback
sys.stderr.write("numa_guest_check: `import torch` in a --check-numa process, which must be torch-free "
                 "(~40 s per process under emulation). Import chain:\\n" + "".join(traceback.format_stack()))
sys.stderr.flush()
os._exit(97)
"""


def torch_tripwire(workdir: Path) -> Path:
    """A directory, put first on PYTHONPATH (inherited by the launcher's children), whose fake
    `torch` package ends the importing process with exit code 97 and prints the import chain."""
    d = workdir / "torch_tripwire"
    (d / "torch").mkdir(parents=True, exist_ok=True)
    (d / "torch" / "__init__.py").write_text(TRIPWIRE)
    return d


def parse_document(stdout: str) -> dict | None:
    """The launcher's one JSON document (starts at the first line that is just '{')."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "{":
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                return None
    return None


def run_launch(binding: str, job: str, workdir: Path, nodes: dict[int, list[int]]) -> dict:
    """One `--check-numa` launch for one binding method; checks its reports. Returns a summary."""
    run_dir = workdir / job
    cfg_path = workdir / f"{job}.yaml"
    # json.dumps: a valid YAML double-quoted scalar whatever the path contains
    cfg_path.write_text(CONFIG.format(job=job, run_dir=json.dumps(str(run_dir)), n=NUM_COLLECTORS, binding=binding))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(torch_tripwire(workdir)), str(REPO),
                                                     env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "fastsac.launcher", str(cfg_path), "--check-numa"]
    print(f"\n== {binding}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=LAUNCH_TIMEOUT_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, exc.stdout or "", exc.stderr or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
    wall = time.monotonic() - t0
    print(f"   launcher exit code {rc} after {wall:.1f} s", flush=True)
    summary: dict = {"job": job, "exit_code": rc, "wall_s": round(wall, 1), "collectors": {}, "learner": None}

    doc = parse_document(out)
    ok = check(rc == 0 and doc is not None and not doc.get("failed"),
               f"{binding}: launcher --check-numa exited 0 and every process ran "
               f"(exit code {rc}{'; timed out' if rc is None else ''}"
               f"{'; failed: ' + '; '.join(doc['failed']) if doc and doc.get('failed') else ''})", key="launch")
    if not ok:
        if err.strip():
            print("   launcher stderr:\n" + "\n".join("     " + x for x in err.strip().splitlines()[-30:]))
        if doc is None and out.strip():
            print("   launcher stdout (no JSON document):\n" + "\n".join("     " + x for x in out.splitlines()[-30:]))
        for log in sorted((run_dir / "logs").glob("*.log")):
            print(f"   --- {log}:\n" + "\n".join("     " + x for x in tail(log).splitlines()))
    if doc is None:
        return summary

    plan = doc.get("plan", {})
    reports = doc.get("reports", [])
    pcols = {c["collector_id"]: c for c in plan.get("collectors", [])}
    check(plan.get("binding") == binding and plan.get("placement") == "spread",
          f"{binding}: plan binding {plan.get('binding')!r}, placement {plan.get('placement')!r}")
    check(sorted(pcols) == list(range(NUM_COLLECTORS)), f"{binding}: plan has collectors {sorted(pcols)}")

    learners = [r for r in reports if r.get("role") == "learner"]
    rcols: dict[int, list[dict]] = {}
    for r in reports:
        if r.get("role") == "collector":
            rcols.setdefault(r.get("collector_id"), []).append(r)
    check(len(learners) == 1 and sorted(rcols) == list(range(NUM_COLLECTORS))
          and all(len(v) == 1 for v in rcols.values()),
          f"{binding}: one report per process (learner: {len(learners)}, collectors: "
          f"{ {k: len(v) for k, v in sorted(rcols.items())} })", key="reports")

    for i in range(NUM_COLLECTORS):
        want_cpus = nodes.get(i)
        p = pcols.get(i, {})
        argv = p.get("argv", [])
        if binding == "numactl":
            how = os.path.basename(argv[0]) == "numactl" if argv else False
            how = how and f"--membind={i}" in argv
        else:
            how = "--bind-node" in argv and argv[argv.index("--bind-node") + 1] == str(i) \
                and os.path.basename(argv[0]) != "numactl"
        check(p.get("node") == i and p.get("cpus") == want_cpus and how,
              f"{binding}: collector {i} planned on node {p.get('node')} CPUs {p.get('cpulist')} "
              f"(node {i} has CPUs {want_cpus}), started as: {' '.join(argv[:4])} ...")
        r = (rcols.get(i) or [None])[0]
        if r is None:
            check(False, f"{binding}: collector {i} sent no report")
            continue
        print(f"   collector {i} (pid {r['pid']}, binding {r['binding']}): CPUs {r['cpus']}, "
              f"policy {r['mempolicy']}:{r['mem_nodes']}, segment pages per node {r.get('segment_pages')}, "
              f"segment bytes {r.get('segment_bytes')}", flush=True)
        check(r.get("binding") == binding and r.get("planned_node") == i,
              f"{binding}: collector {i} reports binding {r.get('binding')!r}, planned node {r.get('planned_node')}; "
              f"expected {binding!r}, node {i}")
        check(r.get("cpus") == want_cpus,
              f"{binding}: collector {i} runs on CPUs {r.get('cpus')}; expected node {i}'s CPUs {want_cpus}",
              key=f"cpus{i}")
        check(r.get("mempolicy") == "bind" and r.get("mem_nodes") == [i],
              f"{binding}: collector {i} memory policy {r.get('mempolicy')}:{r.get('mem_nodes')}; expected bind:[{i}]",
              key=f"policy{i}")
        pages = r.get("segment_pages") or {}
        sizes = r.get("segment_bytes")
        page_size = r.get("page_size") or os.sysconf("SC_PAGE_SIZE")
        kinds = {name.rsplit(".", 1)[-1] for name in pages}
        check(kinds == {"ring", "wts"} and all(f".{job}.c{i}." in name for name in pages),
              f"{binding}: collector {i} reports its ring and snapshot segments ({sorted(pages)})")
        for name, per_node in sorted(pages.items()):
            n = per_node.get(str(i), 0)
            others = {k: v for k, v in per_node.items() if k != str(i) and v}
            what = f"{binding}: collector {i} segment {name}: pages per node {per_node}"
            if sizes is not None and name in sizes:
                want = -(-sizes[name] // page_size)
                check(n == want and not others, f"{what}; expected all {want} pages ({sizes[name]} bytes) on node {i}")
            else:
                check(n > 0 and not others, f"{what}; expected > 0 pages, all on node {i} (no size in the report)")
        summary["collectors"][i] = {"pid": r.get("pid"), "cpus": r.get("cpus"), "mempolicy": r.get("mempolicy"),
                                    "mem_nodes": r.get("mem_nodes"), "segment_pages": pages, "segment_bytes": sizes}

    if learners:
        lr = learners[0]
        node = lr.get("planned_node")
        print(f"   learner (pid {lr['pid']}, binding {lr['binding']}): planned node {node} CPUs {lr['planned_cpus']}; "
              f"runs on CPUs {lr['cpus']}, policy {lr['mempolicy']}:{lr['mem_nodes']}", flush=True)
        check(lr.get("binding") == binding and node in nodes and lr.get("planned_cpus")
              and set(lr.get("planned_cpus")) <= set(nodes[node]) and lr.get("cpus") == lr.get("planned_cpus")
              and lr.get("mempolicy") == "bind" and lr.get("mem_nodes") == [node],
              f"{binding}: learner bound to its planned node {node}: CPUs {lr.get('cpus')} "
              f"(planned {lr.get('planned_cpus')}, node {node} has {nodes.get(node)}), "
              f"policy {lr.get('mempolicy')}:{lr.get('mem_nodes')}")
        summary["learner"] = {"node": node, "cpus": lr.get("cpus"), "mempolicy": lr.get("mempolicy"),
                              "mem_nodes": lr.get("mem_nodes")}

    left = shm_segments(f"fastsac.{job}.")
    check(not left, f"{binding}: no segment of job {job} left in {SHM_DIR} ({left or 'none'})")
    return summary


def negative_control(job: str, workdir: Path, nodes: dict[int, list[int]]) -> dict:
    """The same launch with numa_binding: off, i.e. unbound collectors: the checks must catch it.

    Proves the /proc-based checks can fail: the launch runs and reports, and for every collector
    the CPU check and the memory-policy check fail. Its checks are kept out of the verdict; one
    summary check goes in.
    """
    print("\n== negative control: numa_binding off; the CPU and memory-policy checks below must FAIL", flush=True)
    start = len(checks)
    run_launch("off", job, workdir, nodes)
    control = checks[start:]
    del checks[start:]
    outcome = {key: ok for ok, _, key in control if key}
    must_fail = [f"{k}{i}" for i in range(NUM_COLLECTORS) for k in ("cpus", "policy")]
    ran = outcome.get("launch") is True and outcome.get("reports") is True
    caught = [k for k in must_fail if outcome.get(k) is False]
    check(ran and caught == must_fail,
          f"negative control (numa_binding: off): the launch ran and reported ({ran}); the unbound collectors "
          f"failed the checks {caught} (all of {must_fail} must fail)")
    return {"ran": ran, "caught": caught, "failed": [what for ok, what, _ in control if not ok]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-prefix", default=f"ngc{os.getpid()}",
                    help="job names are PREFIX_numactl and PREFIX_inprocess (unique per run)")
    ap.add_argument("--workdir", help="config + run_dir go here (default: a new folder in the current directory)")
    ap.add_argument("--bindings", default=",".join(BINDINGS), help="comma-separated subset of numactl,inprocess")
    ap.add_argument("--keep", action="store_true", help="keep the work folder even when everything passed")
    ap.add_argument("--negative-control", action="store_true",
                    help="also launch with numa_binding: off and require the checks to catch the unbound collectors")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    in_guest = os.environ.get("NUMA_VM_GUEST") == "1"
    bindings = [b for b in args.bindings.split(",") if b]
    bad = [b for b in bindings if b not in BINDINGS]
    if bad:
        ap.error(f"unknown binding(s) {bad}; choose from {BINDINGS}")
    jobs = {b: f"{args.job_prefix}_{b}" for b in [*bindings, *(["off"] if args.negative_control else [])]}
    if any(len(j) > 32 for j in jobs.values()):
        ap.error(f"--job-prefix {args.job_prefix!r} is too long: job names are at most 32 characters")

    nodes = node_cpus()
    print(f"python {sys.executable}; NUMA_VM_GUEST={os.environ.get('NUMA_VM_GUEST', '')}; "
          f"nodes with CPUs: { {n: c for n, c in nodes.items()} }", flush=True)
    result: dict = {"in_guest": in_guest, "nodes": nodes, "bindings": {}}
    if len(nodes) < NUM_COLLECTORS:
        reason = f"needs >= {NUM_COLLECTORS} NUMA nodes with CPUs, found {sorted(nodes)}"
        if not in_guest:
            print(f"SKIP: {reason}")
            print(RESULT_PREFIX + json.dumps({**result, "passed": None, "skipped": reason}), flush=True)
            return 0
        check(False, f"the NUMA guest has 2 nodes: {reason}")
    else:
        if shutil.which("numactl"):
            hw = subprocess.run(["numactl", "--hardware"], capture_output=True, text=True)
            print(hw.stdout.rstrip(), flush=True)
        elif "numactl" in bindings:
            check(False, "numactl is installed (needed for numa_binding: numactl)")
        leftover = shm_segments() if in_guest else []   # a fresh guest /dev/shm has no fastsac segment
        check(not leftover, f"{SHM_DIR} holds no fastsac segment before the launches ({leftover or 'none'})")
        workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="numa_guest_check.",
                                                                             dir=os.getcwd()))
        workdir.mkdir(parents=True, exist_ok=True)
        for b in bindings:
            result["bindings"][b] = run_launch(b, jobs[b], workdir, nodes)
        if args.negative_control:
            result["negative_control"] = negative_control(jobs["off"], workdir, nodes)
        left = shm_segments() if in_guest else [s for j in jobs.values() for s in shm_segments(f"fastsac.{j}.")]
        check(not left, f"{SHM_DIR} holds no fastsac segment after the launches ({left or 'none'})")

    failures = [what for ok, what, _ in checks if not ok]
    passed = not failures
    if passed and not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not passed and len(nodes) >= NUM_COLLECTORS:
        print(f"configs and process logs kept in {workdir}")
    wall = time.monotonic() - t_start
    print(f"\nRESULT: {'PASS' if passed else 'FAIL'}: {len(checks) - len(failures)} of {len(checks)} checks passed "
          f"in {wall:.1f} s" + "".join(f"\n  FAILED: {w}" for w in failures), flush=True)
    print(RESULT_PREFIX + json.dumps({**result, "passed": passed, "checks": len(checks), "failures": failures,
                                      "wall_s": round(wall, 1)}), flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
