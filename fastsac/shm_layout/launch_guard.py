"""The launch guard: one launcher of a job at a time, through a user-private flock (see
_hold_launch_guard for why the control segment's own lock is not enough)."""
from __future__ import annotations

import errno
import fcntl
import os
import stat

from fastsac.shm_layout.cleanup import _ctl_launcher_pid
from fastsac.shm_layout.common import ShmLayoutError, validate_job_name
from fastsac.shm_layout.locks import job_is_alive


class LaunchLockError(ShmLayoutError):
    """The job cannot start: another launcher of it holds the launch lock (or the lock is unusable)."""


def launch_lock_dir() -> str:
    """A directory only this user can write: $XDG_RUNTIME_DIR/fastsac, else /tmp/fastsac-<uid>.

    The launch lock must be private to the user: a lock in a shared namespace (an abstract
    socket name, a file in /tmp or /dev/shm) can be taken by any local user, who would then
    keep the job from ever starting.
    """
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == uid:
        path = os.path.join(runtime, "fastsac")
    else:
        path = f"/tmp/fastsac-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LaunchLockError(f"cannot create the launch-lock directory {path}: {exc}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise LaunchLockError(f"the launch-lock directory {path} is not a private directory of uid {uid} "
                              f"(owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}); another user may have "
                              "made it: remove it, or set XDG_RUNTIME_DIR to a directory of yours")
    return path


def _hold_launch_guard(job: str) -> int:
    """Take the exclusive flock on <launch_lock_dir>/<job>.launch: one launcher of a job at a time.

    The control segment's lock says whether a launcher is alive, but a launch first removes
    stale segments and then creates the control segment, and two launches started within
    microseconds could both pass the liveness check and one remove the other's new segment.
    flock is atomic and the kernel drops it when its holder exits, however it dies; the file
    lives in a directory private to the user, so nobody else can take it. Returns the fd
    (close-on-exec: children do not inherit it).
    """
    path = os.path.join(launch_lock_dir(), f"{validate_job_name(job)}.launch")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise LaunchLockError(f"job {job!r}: cannot take the launch lock {path}: {exc}") from None
        pid = _ctl_launcher_pid(job) if job_is_alive(job) else -1
        holder = f"launcher pid {pid}" if pid > 0 else "another launcher of it is starting"
        raise LaunchLockError(f"job {job!r} is already running ({holder}; it holds {path}); pick another "
                              "job_name or stop it first") from None
    return fd
