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
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHM_DIR = "/dev/shm"
# The working tree's runs/ belongs to the user (the README's train command fills it before the
# tests run): no test may read or write it; tests use their tmp_path.
WORKTREE_RUNS = str(Path(__file__).resolve().parents[1] / "runs")
_runs_opened: list[str] = []
TEST_JOB_PREFIX = f"t{os.getpid()}"
_counter = itertools.count()
_stats = {"jobs": 0, "cleaned": 0}
_leaked: list[str] = []


def _own_segments(prefix: str) -> list[str]:
    """Segment file names in /dev/shm of jobs whose name starts with prefix."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(f"fastsac.{prefix}"))


def _unlink_names(names: list[str]) -> list[str]:
    import posix_ipc  # direct unlink: test-owned names, whatever state the test left them in
    removed = []
    for n in names:
        try:
            posix_ipc.unlink_shared_memory("/" + n)
            removed.append("/" + n)
        except posix_ipc.ExistentialError:
            pass
    return removed


def new_job_name() -> str:
    """A job name owned by this test session (at most 32 characters)."""
    _stats["jobs"] += 1
    return f"{TEST_JOB_PREFIX}_{next(_counter)}"


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


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """With `-m "not process"` (the fast tier) a test that starts a process fails, naming the
    marker it lacks: the tier's promise (in-process only) is checked, not hoped for."""
    if "not process" not in (request.config.option.markexpr or "") or request.node.get_closest_marker("process"):
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(mp.process.BaseProcess, "start", refuse)
    yield


@pytest.fixture(scope="session", autouse=True)
def torch_runtime():
    """The process-wide torch settings every fastsac process makes at start (subnormals flushed)."""
    from fastsac.run.torch_runtime import configure_torch
    configure_torch()
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
