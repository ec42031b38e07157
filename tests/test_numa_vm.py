"""Real-kernel NUMA placement of a 2-collector job, checked inside a 2-node QEMU guest.

Boots the guest of ../shared/numa-vm once (`run-in-numa-vm`, 2 nodes x 1 vCPU, software
emulation: ~10 s to boot, every Python start in it costs seconds) and runs
tests/numa_guest_check.py there: `fastsac-launch CFG --check-numa` with placement: spread,
once with numa_binding: numactl and once with inprocess. The guest script checks, from /proc,
that collector i runs on node i's CPUs under a bind:i memory policy and that every page of its
ring and weight-snapshot segments is on node i, that the learner is bound to its planned node,
and that /dev/shm is clean afterwards. No training and no torch in the guest (check mode).

Skipped, with the reason, where it cannot run: no ../shared/numa-vm/run-in-numa-vm, not an
x86_64 Linux host, or already inside the guest. NUMA_VM_TIMEOUT (default here 480 s) bounds the
VM run; the test kills the VM itself a little after that whatever happens.
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

HERE = Path(__file__).resolve().parent
RUN_IN_VM = Path(__file__).resolve().parents[2] / "shared" / "numa-vm" / "run-in-numa-vm"
GUEST_SCRIPT = HERE / "numa_guest_check.py"
RESULT_PREFIX = "NUMA-GUEST-RESULT "   # tests/numa_guest_check.py's machine-readable line
BINDINGS = {"numactl", "inprocess"}
VM_TIMEOUT_S = int(os.environ.get("NUMA_VM_TIMEOUT", "480"))
# run-in-numa-vm stops the VM itself after NUMA_VM_TIMEOUT (exit 124); this outer bound also
# covers a first run's apt install and boot, so the test can never hang.
HARD_TIMEOUT_S = VM_TIMEOUT_S + 300
SHM_DIR = "/dev/shm"


def _skip_reason() -> str | None:
    if os.environ.get("NUMA_VM_GUEST") == "1":
        return "already inside the NUMA VM guest (NUMA_VM_GUEST=1); this test boots the VM from the host"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the NUMA VM needs an x86_64 Linux host, this is {platform.system()} {platform.machine()}"
    if not RUN_IN_VM.is_file():
        return f"{RUN_IN_VM} is missing (the shared numa-vm tool, see its README)"
    if not os.access(RUN_IN_VM, os.X_OK):
        return f"{RUN_IN_VM} is not executable"
    return None


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
            pytest.skip(f"{exe} resolves to {os.path.realpath(exe)}, which is a script (a shim?), not the "
                        "interpreter binary; run pytest with the real interpreter")
    return exe


def _own_segments(job_prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"fastsac.{job_prefix}_"))
    except FileNotFoundError:
        return []


def _stop(proc: subprocess.Popen) -> str:
    """Stop run-in-numa-vm (its TERM trap kills QEMU), then its whole process group."""
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


@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_spread_collectors_are_bound_and_first_touch_on_their_node(tmp_path, job_name):
    python = _interpreter()
    workdir = tmp_path / "guest"    # configs + process logs; kept by pytest for a post-mortem
    cmd = [str(RUN_IN_VM), python, str(GUEST_SCRIPT), "--job-prefix", job_name, "--workdir", str(workdir)]
    env = dict(os.environ, NUMA_VM_TIMEOUT=str(VM_TIMEOUT_S), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    # The VM shares the current directory read-write (and nothing else): run it in tmp_path.
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
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
    print(f"run-in-numa-vm exit code {rc} after {wall:.1f} s (test wall time; output also in "
          f"{tmp_path / 'vm-output.log'})")

    tail = "\n".join(out.splitlines()[-60:])
    assert not timed_out, f"the VM run did not end within {HARD_TIMEOUT_S} s and was killed; output tail:\n{tail}"
    assert rc != 124, f"the VM did not boot in time or the run exceeded NUMA_VM_TIMEOUT={VM_TIMEOUT_S} s:\n{tail}"
    assert rc != 125, f"run-in-numa-vm could not set the VM up (packages, kernel or QEMU), see:\n{tail}"
    results = [json.loads(line[len(RESULT_PREFIX):]) for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    assert len(results) == 1, f"no result line from the guest script (exit code {rc}); output tail:\n{tail}"
    result = results[0]
    failures = "\n  ".join(result.get("failures") or [])
    assert result.get("in_guest") is True, f"the guest script did not run inside the VM: {result}"
    assert result.get("passed") is True, f"NUMA placement check failed in the guest:\n  {failures}\n{tail}"
    assert rc == 0, f"the guest script passed but run-in-numa-vm exited {rc}:\n{tail}"
    assert set(result["bindings"]) == BINDINGS, f"not every binding method ran: {sorted(result['bindings'])}"
    for binding, summary in result["bindings"].items():
        assert sorted(summary["collectors"]) == ["0", "1"], f"{binding}: collectors reported {summary}"
        for cid, col in summary["collectors"].items():
            assert col["mem_nodes"] == [int(cid)] and all(set(p) == {cid} for p in col["segment_pages"].values()), \
                f"{binding}: collector {cid}: {col}"
    assert not left, f"segments of this test's jobs appeared in the host's {SHM_DIR}: {left}"
