"""Real-kernel NUMA placement of a 2-collector job, checked inside a 2-node QEMU guest.

Boots the project's own guest once (tools/numa-vm/numa_vm.py: 2 nodes x 1 vCPU, Debian's
kernel, software emulation unless hardware KVM is there: a few seconds to boot, every Python
start in it costs seconds) and runs tests/support/numa_guest_check.py there: `fastsac-launch CFG
--check-numa` with placement: spread, once with numa_binding: numactl and once with inprocess.
The guest script checks, from /proc, that collector i runs on node i's CPUs under a bind:i
memory policy and that every page of its ring and weight-snapshot segments is on node i, that
the learner is bound to its planned node, and that /dev/shm is clean afterwards. A negative
control launches once more with numa_binding: off and requires those checks to fail for the
unbound collectors. No training and no torch in the guest (check mode). Two shorter boots test
the harness itself (shared directory, output streams, exit status) and run
tests/support/numa_vm_probe.py (binding syscalls, first touch, planning inside a cgroup cpuset).

Skipped, with the reason, only where the guest cannot run: not an x86_64 Linux host, or
`numa_vm.py prepare` reports that QEMU, a static busybox or Debian's kernel cannot be had here
(scripts/test.sh installs them as root; the reason says what is missing). Any other failure to
prepare or boot the guest fails the test. VM_TIMEOUT_S bounds the VM run (the harness kills
the VM); the test kills the harness a little after that whatever happens.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]
NUMA_VM = TESTS.parent / "tools" / "numa-vm" / "numa_vm.py"
GUEST_SCRIPT = TESTS / "support" / "numa_guest_check.py"
PROBE_SCRIPT = TESTS / "support" / "numa_vm_probe.py"
RESULT_PREFIX = "NUMA-GUEST-RESULT "   # tests/support/numa_guest_check.py's machine-readable line
BINDINGS = {"numactl", "inprocess"}
UNAVAILABLE = 3            # numa_vm.py prepare: this host cannot run the guest
PREPARE_TIMEOUT_S = 600    # a first prepare downloads Debian's kernel package (~70 MB)
VM_TIMEOUT_S = 480         # whole VM run (measured 45-118 s on a 2-core host under emulation, idle to loaded)
HARD_TIMEOUT_S = VM_TIMEOUT_S + 60
SHM_DIR = "/dev/shm"


@pytest.fixture(scope="module")
def numa_vm_ready():
    """Skip with the reason where the guest cannot run here; fail when preparing it breaks."""
    if os.environ.get("NUMA_VM_GUEST") == "1":
        pytest.skip("already inside the NUMA VM guest (NUMA_VM_GUEST=1); this test boots the VM from the host")
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip(f"the NUMA VM needs an x86_64 Linux host, this is {platform.system()} {platform.machine()}")
    proc = subprocess.run([sys.executable, str(NUMA_VM), "prepare"], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=PREPARE_TIMEOUT_S)
    if proc.returncode == UNAVAILABLE:
        pytest.skip(f"the NUMA VM cannot run on this host: {proc.stderr.strip()}")
    assert proc.returncode == 0, f"`numa_vm.py prepare` failed (exit code {proc.returncode}):\n{proc.stderr}"


def _interpreter() -> str:
    """The interpreter for the guest: this one, called by a path to the real binary.

    sys.executable of a running interpreter is never a pyenv shim (the shim execs the real
    binary), but in a virtual environment it is the venv's symlink, which must be kept as is:
    its realpath is the base interpreter, which would lose the venv's packages (fastsac, numpy,
    posix_ipc). Guard against a script anyway: under emulation a shim costs 17-38 s.
    """
    exe = sys.executable
    with open(os.path.realpath(exe), "rb") as f:
        if f.read(4) != b"\x7fELF":
            pytest.fail(f"{exe} resolves to {os.path.realpath(exe)}, which is a script (a shim?), not the "
                        "interpreter binary; run pytest with the real interpreter")
    return exe


def _own_segments(job_prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"fastsac.{job_prefix}_"))
    except FileNotFoundError:
        return []


def _stop(proc: subprocess.Popen) -> str:
    """Stop the harness (SIGTERM: it kills QEMU), then its whole process group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
            return out or ""
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, _ = proc.communicate()
    return out or ""


@pytest.mark.process
def test_harness_shares_the_work_directory_streams_output_and_returns_the_exit_status(numa_vm_ready, tmp_path):
    """One short boot: 2 nodes in the guest, the work directory shared read-write and the rest of
    the host root not, the command's stdout/stderr appended to the caller's own log file (which
    already holds a line: nothing may overwrite it), and the command's exit status returned."""
    outside = tmp_path.parent / f"numa-vm-outside-{os.getpid()}"
    script = (f"ls -d /sys/devices/system/node/node*; echo to-stdout; echo to-stderr >&2; echo shared > written.txt; "
              f"echo lost > {outside}; test \"$NUMA_VM_GUEST\" = 1 && exit 7")
    log = tmp_path / "harness.log"
    with open(log, "w") as f:   # not O_APPEND, offset after the first line: like a CI log
        f.write("before the VM\n")
        f.flush()
        proc = subprocess.run([sys.executable, str(NUMA_VM), "run", "--timeout", "120", "--", "sh", "-c", script],
                              cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=f, stderr=f, timeout=180)
        f.write("after the VM\n")
    text = log.read_text()
    print(text)
    assert proc.returncode == 7, text
    lines = text.splitlines()
    assert lines[0] == "before the VM" and lines[-1] == "after the VM", text
    for want in ("/sys/devices/system/node/node0", "/sys/devices/system/node/node1", "to-stdout", "to-stderr"):
        assert want in lines, f"{want!r} missing from the log:\n{text}"
    assert any(line.startswith("numa-vm: guest up after") for line in lines), text
    assert not any(line.endswith("node2") for line in lines), text
    assert (tmp_path / "written.txt").read_text() == "shared\n"
    assert not outside.exists(), f"a write outside the work directory reached the host: {outside}"


@pytest.mark.process
def test_probe_binds_first_touches_and_plans_inside_a_cpuset_on_the_real_kernel(numa_vm_ready, tmp_path):
    """tests/support/numa_vm_probe.py in the guest: the plan's numactl and in-process commands bind for
    real, each child's first-touched segment lands on its node, and discovery inside a cgroup
    cpuset plans around Mems_allowed_list."""
    cmd = [sys.executable, str(NUMA_VM), "run", "--timeout", "240", "--", _interpreter(), str(PROBE_SCRIPT)]
    proc = subprocess.run(cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0 and "ALL PASSED" in proc.stdout, proc.stdout[-6000:]
    assert "SKIP" not in proc.stdout, proc.stdout[-6000:]


@pytest.mark.process
def test_spread_collectors_are_bound_and_first_touch_on_their_node(numa_vm_ready, tmp_path, job_name):
    python = _interpreter()
    workdir = tmp_path / "guest"    # configs + process logs; kept by pytest for a post-mortem
    cmd = [sys.executable, str(NUMA_VM), "run", "--timeout", str(VM_TIMEOUT_S), "--",
           python, str(GUEST_SCRIPT), "--job-prefix", job_name, "--workdir", str(workdir), "--negative-control"]
    t0 = time.monotonic()
    # The VM shares the current directory read-write (the rest of the host read-only): run it in tmp_path.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=HARD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        out = _stop(proc)
    finally:
        if proc.poll() is None:   # interrupted (Ctrl-C): never leave a VM running
            _stop(proc)
        left = _own_segments(job_name)
        for name in left:   # the guest has its own /dev/shm: nothing should ever appear here
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
    wall = time.monotonic() - t0
    rc = proc.returncode
    (tmp_path / "vm-output.log").write_text(out)
    print(out)
    print(f"numa_vm.py run exit code {rc} after {wall:.1f} s (test wall time; output also in "
          f"{tmp_path / 'vm-output.log'})")

    tail = "\n".join(out.splitlines()[-60:])
    assert not timed_out, f"the VM run did not end within {HARD_TIMEOUT_S} s and was killed; output tail:\n{tail}"
    assert rc != 124, f"the VM did not boot in time or the run exceeded {VM_TIMEOUT_S} s:\n{tail}"
    assert rc != 125, f"numa_vm.py could not set the VM up or the guest stopped early, see:\n{tail}"
    results = [json.loads(line[len(RESULT_PREFIX):]) for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(results) == 1, f"no result line from the guest script (exit code {rc}); output tail:\n{tail}"
    result = results[0]
    failures = "\n  ".join(result.get("failures") or [])
    assert result.get("in_guest") is True, f"the guest script did not run inside the VM: {result}"
    assert result.get("passed") is True, f"NUMA placement check failed in the guest:\n  {failures}\n{tail}"
    assert rc == 0, f"the guest script passed but numa_vm.py exited {rc}:\n{tail}"
    assert set(result["bindings"]) == BINDINGS, f"not every binding method ran: {sorted(result['bindings'])}"
    for binding, summary in result["bindings"].items():
        assert sorted(summary["collectors"]) == ["0", "1"], f"{binding}: collectors reported {summary}"
        for cid, col in summary["collectors"].items():
            assert col["mem_nodes"] == [int(cid)] and all(set(p) == {cid} for p in col["segment_pages"].values()), \
                f"{binding}: collector {cid}: {col}"
    control = result.get("negative_control") or {}
    assert control.get("ran") is True and control.get("caught") == ["cpus0", "policy0", "cpus1", "policy1"], \
        f"negative control: the checks did not catch unbound collectors: {control}"
    assert not left, f"segments of this test's jobs appeared in the host's {SHM_DIR}: {left}"
