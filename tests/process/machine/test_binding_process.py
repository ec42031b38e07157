"""Binding on the host (1 node): bind/read/verify in child processes, numa_maps parsing, thread env.

Binding changes the calling process for good, so every bind_self runs in a fresh child
interpreter; the test process itself is never re-bound.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastsac.machine.binding import (
    BindingError,
    read_binding,
    verify_binding,
)
from fastsac.machine.topology import format_cpulist

REPO = Path(__file__).resolve().parents[3]
HOST_CPUS = sorted(os.sched_getaffinity(0))


def run_child(body: str, *args: str, stdin: str | None = None) -> dict:
    """Run `body` in a fresh interpreter (torch-free); it must print one JSON line last."""
    code = "import json, os, sys\n" + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=60, input=stdin)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def skip_if_blocked(result: dict) -> None:
    if "EPERM" in result.get("error", ""):
        pytest.skip("set_mempolicy blocked by seccomp here: " + result["error"])


# --------------------------------------------------------------------------- real syscalls (host)

@pytest.mark.process
def test_bind_self_to_node_0_then_read_and_verify():
    r = run_child(f"""
        from fastsac.machine.binding import bind_self, read_binding, verify_binding, BindingError
        try:
            res = bind_self(0, {HOST_CPUS})
        except BindingError as e:
            print(json.dumps({{"error": str(e)}})); raise SystemExit
        eff = read_binding()
        verify_binding(0, {HOST_CPUS})
        proc = read_binding(os.getpid())        # the /proc path must agree with the syscalls
        out = {{"cpus": eff.cpus, "mode": eff.mempolicy, "nodes": eff.mem_nodes, "res_cpus": res.cpus,
               "proc_cpus": proc.cpus, "proc_mode": proc.mempolicy, "proc_nodes": proc.mem_nodes,
               "repinned": res.repinned_threads, "source": proc.source}}
        for node, cpus in ((1, {HOST_CPUS}), (0, [{HOST_CPUS[0]}, 4096])):
            try:
                verify_binding(node, cpus)
                out[f"verify{{node}}"] = "passed"
            except BindingError as e:
                out[f"verify{{node}}"] = str(e)
        print(json.dumps(out))
    """)
    skip_if_blocked(r)
    cpus = format_cpulist(HOST_CPUS)
    assert r["cpus"] == HOST_CPUS and r["res_cpus"] == HOST_CPUS and r["proc_cpus"] == HOST_CPUS
    assert (r["mode"], r["nodes"], r["proc_mode"], r["proc_nodes"]) == ("bind", [0], "bind", [0])
    assert r["repinned"] == [] and r["source"].startswith("/proc/")
    assert r["verify1"] == (f"this process is not bound as planned (node 1, CPUs {cpus}): memory policy is bind:0 "
                            "but the plan says bind:1")
    want = format_cpulist([HOST_CPUS[0], 4096])
    extra = format_cpulist(HOST_CPUS[1:])
    detail = "missing 4096" + (f"; unexpected {extra}" if extra else "")
    assert r["verify0"] == (f"this process is not bound as planned (node 0, CPUs {want}): CPU affinity is {cpus} "
                            f"but the plan says {want} ({detail})")


@pytest.mark.process
def test_bind_self_repins_threads_started_before_it():
    cpu = HOST_CPUS[-1]
    r = run_child(f"""
        import threading
        from fastsac.machine.binding import bind_self, BindingError
        ev = threading.Event(); started = threading.Event(); tid = []
        def worker():
            tid.append(threading.get_native_id()); started.set(); ev.wait()
        t = threading.Thread(target=worker); t.start(); started.wait()
        try:
            res = bind_self(0, [{cpu}])
        except BindingError as e:
            print(json.dumps({{"error": str(e)}})); raise SystemExit
        out = {{"thread_cpus": sorted(os.sched_getaffinity(tid[0])), "repinned": res.repinned_threads,
               "tid": tid[0], "main": sorted(os.sched_getaffinity(0))}}
        ev.set(); t.join()
        print(json.dumps(out))
    """)
    skip_if_blocked(r)
    assert r["main"] == [cpu] and r["thread_cpus"] == [cpu] and r["repinned"] == [r["tid"]]


@pytest.mark.process
def test_other_process_binding_read_from_proc():
    cpu = HOST_CPUS[0]
    code = textwrap.dedent(f"""
        import sys
        from fastsac.machine.binding import bind_self
        bind_self(0, [{cpu}])
        print("bound", flush=True)
        sys.stdin.readline()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        line = child.stdout.readline()
        if line.strip() != "bound":
            err = child.stderr.read() if child.poll() is not None else ""
            if "EPERM" in err:
                pytest.skip("set_mempolicy blocked by seccomp")
            pytest.fail(f"child did not bind: {line!r} {err}")
        eff = read_binding(child.pid)
        assert eff.cpus == (cpu,) and eff.mempolicy == "bind" and eff.mem_nodes == (0,)
        assert verify_binding(0, [cpu], pid=child.pid) == eff
        with pytest.raises(BindingError, match=rf"pid {child.pid} is not bound as planned"):
            verify_binding(1, [cpu], pid=child.pid)
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=30)


@pytest.mark.process
def test_bind_to_a_missing_node_fails_clearly():
    r = run_child("""
        from fastsac.machine.binding import bind_self, BindingError
        try:
            bind_self(63, sorted(os.sched_getaffinity(0)))
            print(json.dumps({"error": ""}))
        except BindingError as e:
            print(json.dumps({"error": str(e)}))
    """)
    skip_if_blocked(r)
    assert r["error"].startswith("set_mempolicy(MPOL_BIND, node 63) failed: EINVAL: node 63 does not exist, has no "
                                 "memory or is outside this process's Mems_allowed_list (")


@pytest.mark.process
def test_bind_to_cpus_outside_the_affinity_fails_clearly():
    r = run_child("""
        from fastsac.machine.binding import bind_self, BindingError
        try:
            bind_self(0, [4095])
            print(json.dumps({"error": ""}))
        except BindingError as e:
            print(json.dumps({"error": str(e)}))
    """)
    skip_if_blocked(r)
    assert r["error"].startswith("sched_setaffinity to CPUs 4095 failed (")
    assert f"this process may use CPUs {format_cpulist(HOST_CPUS)}" in r["error"]


@pytest.mark.process
def test_bind_from_argv_in_a_child():
    cpu = HOST_CPUS[0]
    r = run_child("""
        from fastsac.machine.binding import bind_from_argv, BindingError
        try:
            res = bind_from_argv()
        except BindingError as e:
            print(json.dumps({"error": str(e)})); raise SystemExit
        print(json.dumps({"node": res.node, "cpus": res.cpus, "mode": res.effective.mempolicy}))
    """, "--config", "x.yaml", "--bind-node", "0", f"--bind-cpus={cpu}", "seed=2")
    skip_if_blocked(r)
    assert r == {"node": 0, "cpus": [cpu], "mode": "bind"}


@pytest.mark.process
def test_modules_import_without_torch_or_numpy():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, fastsac.machine.topology, fastsac.machine.binding, fastsac.machine.plan, "
                               # what a role process imports before it binds itself
                               "fastsac.process.setup, fastsac.collector_main, fastsac.learner_main, "
                               "fastsac.evaluator_main; "
                               "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), check=True)
    assert out.stdout.strip() == "[]"
