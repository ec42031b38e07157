"""Shared fixtures: unique shared-memory job names and a guarantee of a clean /dev/shm.

Every test that touches shared memory takes its job name from the `job_name` fixture:
"t<pytest pid>_<n>", so concurrent test sessions (other engineers on the same machine)
never collide, and this session removes exactly its own segments and nobody else's.

Cleanup happens at two levels, so even a failing or crashing test leaves nothing:
  1. `job_name` teardown unlinks every segment of that job (tests may rely on this
     instead of unlinking themselves), and `procs` kills the processes a test started;
  2. pytest_sessionfinish sweeps anything left with this session's prefix (a job name
     made without the fixture, a process that created a segment after its test ended)
     and the terminal summary reports it: such a leak is a bug even if the test passed.

The folder is the tier: every test under tests/process gets the `process` marker here; the tests
under tests/unit are the fast, in-process tier (`pytest tests/unit`, or `-m "not process"`).
Helpers live in tests/support (`from support.<module> import ...`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.shm_jobs import SHM_DIR, TEST_JOB_PREFIX, _own_segments, _stats, _unlink_names, new_job_name

# The working tree's runs/ belongs to the user (the README's train command fills it before the
# tests run): no test may read or write it; tests use their tmp_path.
WORKTREE_RUNS = str(Path(__file__).resolve().parents[1] / "runs")
# Every test under tests/process starts processes: the folder gives it the `process` marker; the
# tests under tests/unit are the fast, in-process tier.
PROCESS_TESTS = Path(__file__).resolve().parent / "process"
UNIT_TESTS = Path(__file__).resolve().parent / "unit"
_runs_opened: list[str] = []
_leaked: list[str] = []


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if PROCESS_TESTS in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.process)


@pytest.fixture
def job_name():
    """A fresh job name; all its segments are unlinked after the test, pass or fail."""
    job = new_job_name()
    yield job
    # The trailing '.' keeps job t123_1 from matching t123_10.
    _stats["cleaned"] += len(_unlink_names(_own_segments(job + ".")))


@pytest.fixture
def procs():
    """start(target, *args): a multiprocessing 'spawn' process, killed at teardown if still alive."""
    ctx = mp.get_context("spawn")
    started: list = []

    def start(target, *args, daemon=True):
        p = ctx.Process(target=target, args=args, daemon=daemon)
        p.start()
        started.append(p)
        return p

    yield start
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(5)


def _audit_runs_opens(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if path == WORKTREE_RUNS or path.startswith(WORKTREE_RUNS + os.sep):
            _runs_opened.append(path)


sys.addaudithook(_audit_runs_opens)   # this process's opens; a child's writes show in the tree's state


def _runs_state() -> list[tuple[str, int]]:
    if not os.path.isdir(WORKTREE_RUNS):
        return []
    return sorted((str(p), p.stat().st_mtime_ns) for p in Path(WORKTREE_RUNS).rglob("*"))


@pytest.fixture(autouse=True)
def _no_test_touches_the_working_trees_runs(request):
    before = _runs_state()
    del _runs_opened[:]
    yield
    opened, changed = list(_runs_opened), _runs_state() != before
    assert not opened and not changed, (f"{request.node.nodeid} {'opened ' + opened[0] if opened else 'wrote into'} "
                                        f"{WORKTREE_RUNS}: tests keep to their tmp_path (give them a run_dir there)")


def _glfw_loader_on_stack() -> bool:
    """True inside `import mujoco` where MUJOCO_GL is unset: MuJoCo then loads glfw, whose library
    loader reads each libglfw's version in a child Python. That child belongs to the import (once
    per process), not to the test that happens to import mujoco first."""
    frame = sys._getframe(2)
    while frame is not None:
        if Path(frame.f_code.co_filename).parts[-2:] == ("glfw", "library.py"):
            return True
        frame = frame.f_back
    return False


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """In the fast tier (`-m "not process"`, and every test under tests/unit) a test that starts a
    process fails, saying where it belongs: the tier's promise (in-process only) is checked, not hoped for."""
    fast = ("not process" in (request.config.option.markexpr or "")
            or UNIT_TESTS in Path(request.node.path).resolve().parents)
    if not fast or request.node.get_closest_marker("process"):
        yield
        return

    popen_init = subprocess.Popen.__init__

    def refuse(*args, **kwargs):
        if _glfw_loader_on_stack():
            return popen_init(*args, **kwargs)
        raise AssertionError(f"{request.node.nodeid} starts a process: it belongs in tests/process (the process tier)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(mp.process.BaseProcess, "start", refuse)
    yield


@pytest.fixture(scope="session", autouse=True)
def torch_runtime():
    """The process-wide torch settings every fastsac process makes at start (subnormals flushed)."""
    from fastsac.algo.cpu_kernels import kernels_in_use
    from fastsac.process.torch_runtime import configure_torch
    configure_torch()
    # the CPU update's C kernels are compiled (a compiler process, once per machine) and loaded once
    # per process: here, not in whichever fast-tier test first updates an agent
    kernels_in_use()
    yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's torch code on one thread: tiny nets only pay sync overhead for a second
    intra-op thread, which also stalls on a busy 2-core machine."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_sessionfinish(session, exitstatus):
    _leaked.extend(_unlink_names(_own_segments(TEST_JOB_PREFIX + "_")))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _stats["jobs"] and not _leaked:
        return
    remaining = _own_segments(TEST_JOB_PREFIX + "_")
    terminalreporter.write_line(
        f"shared memory: {_stats['jobs']} test job(s), {_stats['cleaned']} segment(s) removed by fixture "
        f"teardown, {len(_leaked)} leaked past it, {len(remaining)} left in {SHM_DIR}")
    if _leaked:
        terminalreporter.write_line("  leaked (removed at session end): " + ", ".join(_leaked))
    if remaining:
        terminalreporter.write_line(f"  WARNING: could not remove {remaining}")
