"""Process liveness: is a pid alive, which boot is this. Tiny and dependency-free on purpose:
checkpoint retention and the shared-memory layout both ask, and neither should import the other."""
from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """/proc/sys/kernel/random/boot_id ('' where unreadable): tells this boot from an earlier one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process of this pid exists (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
