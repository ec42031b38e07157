"""Binding on the host (1 node): bind/read/verify in child processes, numa_maps parsing, thread env.

Binding changes the calling process for good, so every bind_self runs in a fresh child
interpreter; the test process itself is never re-bound.
"""
import os
import re
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

HOST_CPUS = sorted(os.sched_getaffinity(0))


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
    assert verify_binding(1, [4, 5], effective=_eff([4, 5], "bind", [1])).mem_nodes == (1,)
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
