"""Job names owned by this test session and their segments in /dev/shm.

A job name is "t<pytest pid>_<n>", so concurrent test sessions (other engineers on the same machine)
never collide, and a session removes exactly its own segments and nobody else's (conftest.py: the
`job_name` fixture and the session-end sweep).
"""
from __future__ import annotations

import itertools
import os

SHM_DIR = "/dev/shm"
TEST_JOB_PREFIX = f"t{os.getpid()}"
_counter = itertools.count()
_stats = {"jobs": 0, "cleaned": 0}


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
