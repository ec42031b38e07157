"""Binding on the host (1 node): bind/read/verify in child processes, numa_maps parsing, thread env.

Binding changes the calling process for good, so every bind_self runs in a fresh child
interpreter; the test process itself is never re-bound.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastsac.machine.binding import (
    BindingError,
    EffectiveBinding,
    bind_from_argv,
    bind_self,
    numa_maps_bytes,
    numa_maps_pages,
    parse_numa_maps,
    read_binding,
    thread_env,
    verify_binding,
)
from fastsac.machine.topology import format_cpulist

REPO = Path(__file__).resolve().parents[1]
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
        assert eff.cpus == (cpu,) and eff.mempolicy == "bind" and eff.mem_nodes == (0,) and eff.bound_node == 0
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


def test_bind_from_argv_without_options_does_nothing():
    assert bind_from_argv(["--config", "x.yaml", "seed=1"]) is None


@pytest.mark.parametrize("argv, message", [
    (["--bind-node", "0"], "--bind-node and --bind-cpus go together; got only --bind-node"),
    (["--bind-node", "x", "--bind-cpus", "0"], "bad --bind-node/--bind-cpus: invalid literal"),
    (["--bind-node", "0", "--bind-cpus", "0-"], "bad --bind-node/--bind-cpus: bad cpulist"),
])
def test_bind_from_argv_rejects_bad_options(argv, message):
    with pytest.raises(BindingError, match="^" + re.escape(message)):
        bind_from_argv(argv)


def test_bind_self_rejects_bad_arguments_before_any_syscall():
    with pytest.raises(BindingError, match="node ids are >= 0"):
        bind_self(-1, [0])
    with pytest.raises(BindingError, match="empty CPU list"):
        bind_self(0, [])


def test_bind_self_refuses_a_non_main_thread():
    import threading
    errors = []

    def worker():
        try:
            bind_self(0, HOST_CPUS)
        except BindingError as exc:
            errors.append(str(exc))
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors == ["bind_self must run on the main thread: the memory policy it sets is per thread, and only "
                      "threads created afterwards inherit it"]


def test_read_binding_of_this_process_is_unbound():
    eff = read_binding()
    assert eff.cpus == tuple(HOST_CPUS) and eff.source == "syscall" and eff.pid == os.getpid()
    assert eff.mempolicy in ("default", "bind", "local", "preferred", "interleave")
    assert "Mems_allowed" in eff.describe()


def test_read_binding_of_a_missing_pid():
    with pytest.raises(BindingError, match="cannot read /proc/999999999/status"):
        read_binding(999999999)


# --------------------------------------------------------------------------- verify (pure)

def _eff(cpus, mode, nodes):
    return EffectiveBinding(pid=1, cpus=tuple(cpus), mempolicy=mode, mem_nodes=tuple(nodes))


def test_verify_messages():
    assert verify_binding(1, [4, 5], effective=_eff([4, 5], "bind", [1])).bound_node == 1
    with pytest.raises(BindingError) as exc:
        verify_binding(1, [4, 5], effective=_eff([0, 1, 2, 3, 4, 5, 6, 7], "default", []))
    assert str(exc.value) == (
        "this process is not bound as planned (node 1, CPUs 4-5): CPU affinity is 0-7 but the plan says 4-5 "
        "(unexpected 0-3,6-7); memory policy is default (no binding: pages land on whichever node the touching "
        "thread runs on) but the plan says bind:1")
    with pytest.raises(BindingError, match=r"memory policy is interleave:0-1 but the plan says bind:1$"):
        verify_binding(1, [4, 5], effective=_eff([4, 5], "interleave", [0, 1]))
    with pytest.raises(BindingError, match=r"memory policy is bind:0-1 but the plan says bind:1$"):
        verify_binding(1, [4, 5], effective=_eff([4, 5], "bind", [0, 1]))


def test_verify_accepts_node_0_on_a_kernel_without_numa():
    verify_binding(0, [0, 1], effective=_eff([0, 1], "unsupported", []))
    with pytest.raises(BindingError):
        verify_binding(1, [0, 1], effective=_eff([0, 1], "unsupported", []))


# --------------------------------------------------------------------------- numa_maps

SAMPLE = """\
55d0c8a00000 default file=/usr/bin/python3.11 mapped=100 N0=100 kernelpagesize_kB=4
55d0c9b00000 default heap anon=2000 dirty=2000 active=10 N0=1500 N1=500 kernelpagesize_kB=4
7f0000000000 bind:1 file=/dev/shm/fastsac.job.c0.ring dirty=4096 N1=4096 kernelpagesize_kB=4
7f1000000000 bind:1 file=/dev/shm/fastsac.job.c0.wts dirty=300 N0=12 N1=288 kernelpagesize_kB=4
7f2000000000 interleave:0-1 file=/dev/shm/other mapped=8 N0=4 N1=4 kernelpagesize_kB=4
7f3000000000 bind=static:1 file=/dev/hugepages/fastsac.huge huge dirty=2 N1=2 kernelpagesize_kB=2048
7f4000000000 prefer (many):0-1 anon=3 dirty=3 N0=3 kernelpagesize_kB=4
7f5000000000 weighted interleave:0-1 anon=4 dirty=4 N1=4 kernelpagesize_kB=4
7f6000000000 default file=/dev/shm/fastsac.with\\040space mapped=1 N0=1 kernelpagesize_kB=4
7f7000000000 local file=/dev/shm/fastsac.empty
7ffd00000000 bind:1 stack anon=33 dirty=33 N1=33 kernelpagesize_kB=4
not a mapping line
"""


def test_parse_numa_maps():
    maps = parse_numa_maps(SAMPLE)
    assert len(maps) == 11
    by_addr = {m.address: m for m in maps}
    ring = by_addr[0x7F0000000000]
    assert (ring.policy, ring.policy_nodes, ring.file, ring.kind, ring.node_pages, ring.page_kb) == \
        ("bind", (1,), "/dev/shm/fastsac.job.c0.ring", "file", ((1, 4096),), 4)
    heap = by_addr[0x55D0C9B00000]
    assert heap.kind == "heap" and heap.node_pages == ((0, 1500), (1, 500)) and heap.file is None
    huge = by_addr[0x7F3000000000]
    assert (huge.policy, huge.policy_nodes, huge.page_kb, huge.node_bytes) == ("bind", (1,), 2048, {1: 4 << 20})
    assert (by_addr[0x7F4000000000].policy, by_addr[0x7F4000000000].policy_nodes) == ("preferred_many", (0, 1))
    assert by_addr[0x7F5000000000].policy == "weighted_interleave" and by_addr[0x7F5000000000].node_pages == ((1, 4),)
    assert by_addr[0x7F6000000000].file == "/dev/shm/fastsac.with space"
    assert by_addr[0x7F7000000000].policy == "local" and by_addr[0x7F7000000000].node_pages == ()
    assert by_addr[0x7FFD00000000].kind == "stack"


def test_numa_maps_pages_sums_matching_files_in_base_pages():
    assert numa_maps_pages(None, "/dev/shm/fastsac.", text=SAMPLE, page_size=4096) == {0: 13, 1: 4384}
    assert numa_maps_pages(None, ".c0.ring", text=SAMPLE, page_size=4096) == {1: 4096}
    # 2 MiB huge pages count as 512 base pages each
    assert numa_maps_pages(None, "fastsac.huge", text=SAMPLE, page_size=4096) == {1: 1024}
    assert numa_maps_bytes(None, "fastsac.huge", text=SAMPLE) == {1: 4 << 20}
    assert numa_maps_pages(None, "/nothing", text=SAMPLE) == {}


def test_numa_maps_of_this_process_and_of_a_missing_one(tmp_path):
    import mmap
    path = Path("/dev/shm") / f"fastsac.test.{os.getpid()}"
    try:
        with open(path, "wb+") as f:
            f.truncate(16 * 4096)
            m = mmap.mmap(f.fileno(), 16 * 4096)
            m[:] = b"\1" * (16 * 4096)   # first touch: every page becomes resident
            pages = numa_maps_pages(os.getpid(), str(path))
            assert sum(pages.values()) == 16 and set(pages) <= set(range(64))
            assert numa_maps_pages(None, str(path)) == pages
            m.close()
    finally:
        path.unlink(missing_ok=True)
    with pytest.raises(BindingError, match="/proc/999999999/numa_maps does not exist"):
        numa_maps_pages(999999999, "x")


# --------------------------------------------------------------------------- thread env

def test_thread_env_sizes_every_pool():
    env = thread_env(3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    assert set(env.values()) == {"3"} and "NUMEXPR_MAX_THREADS" in env
    with pytest.raises(ValueError, match="num_cpus must be >= 1, got 0"):
        thread_env(0)


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
