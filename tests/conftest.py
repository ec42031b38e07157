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

import pytest

SHM_DIR = "/dev/shm"
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
