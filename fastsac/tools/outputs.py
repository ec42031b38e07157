"""Where the tools (fastsac-export, fastsac-eval --video) may write, and how.

A tool's output never replaces a checkpoint: not the file it reads (`fastsac-export RUN/ckpt.pt
... RUN/ckpt.pt` would leave the run without one), not any other fastsac checkpoint, and nothing
inside a run's checkpoints/ directory (the trainers prune and resume from there); nor any other
file of a run's own (metrics.jsonl, tb/, logs/, wandb/, the lock: fastsac.run_dir.contents), and an
existing file only when the tool is told to replace it (fastsac-export --force). Symlinks are
followed before the comparison (a loop is refused, naming the path). Every output goes to a hidden temp file next to it first and is
renamed into place only once it is whole, so a failed write (full disk, I/O error) leaves the
old file, or nothing, at the final path; the probe below creates that temp file up front, so a
directory that takes no files (/proc, read-only) is refused before any work starts.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from fastsac.errors import ConfigError
from fastsac.run_dir.checkpoint import CKPT_GLOB, checkpoint_dir
from fastsac.run_dir.contents import own_file_of_a_run, peek_run_id, resolved

CHECKPOINTS_DIRNAME = checkpoint_dir(Path()).name


def temp_path(out: Path) -> Path:
    """The hidden file next to `out` that a tool writes before renaming it into place."""
    return out.with_name(f".{out.name}.tmp{os.getpid()}")


def _is_run_checkpoints_dir(directory: Path, reads: tuple[Path, ...]) -> bool:
    """A run's checkpoints/: named so, and holding checkpoints (or the one being read); a user's
    own folder that happens to be called checkpoints is not refused."""
    return directory.name == CHECKPOINTS_DIRNAME and (
        any(directory.glob(CKPT_GLOB)) or any(directory == source.resolve().parent for source in reads))


def _is_checkpoint(path: Path) -> bool:
    """A file that names a run id the way a checkpoint does (read without torch: torch.load of any
    other file would only warn and fail)."""
    return peek_run_id(path) is not None


def check_output(key: str, out: Path, reads: tuple[Path, ...] = (), replace: bool = True) -> Path:
    """ConfigError (naming `key`) unless `out` is a file this tool may write: its directory exists
    and takes a new file, and it is none of `reads`, no checkpoint, no file of a run's own, not
    inside checkpoints/, and (unless `replace`) no existing file."""
    shown = str(out)
    real = resolved(key, out)
    if real.is_dir():
        raise ConfigError(f"{key}: {shown!r} is a directory; give a file name")
    if not out.parent.is_dir():
        raise ConfigError(f"{key}: the directory {str(out.parent)!r} of {shown!r} does not exist")
    for source in reads:
        if real == source.resolve():
            raise ConfigError(f"{key}: {shown!r} is the checkpoint this command reads ({str(source)!r}); writing "
                              "there would destroy it. Give another file name")
    if _is_run_checkpoints_dir(real.parent, reads):
        raise ConfigError(f"{key}: {shown!r} is inside a run's {CHECKPOINTS_DIRNAME}/ directory "
                          f"({str(real.parent)!r}), which holds the run's checkpoints only (the trainer prunes "
                          "and resumes from it); write somewhere else")
    if real.is_file() and _is_checkpoint(real):
        raise ConfigError(f"{key}: {shown!r} is a fastsac checkpoint; a tool never writes over one. Give another "
                          "file name")
    run = own_file_of_a_run(real)
    if run is not None:
        raise ConfigError(f"{key}: {shown!r} is one of the files of the run in {str(run)!r} (its metrics, TensorBoard "
                          "files, logs, W&B files or lock); a tool never writes there. Give another file name, e.g. "
                          f"{str(run / ('actor' + out.suffix))!r}")
    if real.exists() and not replace:
        raise ConfigError(f"{key}: {shown!r} exists; give --force to replace it, or another file name")
    probe = temp_path(real)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        why = "the file name is too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror
        raise ConfigError(f"{key}: cannot create a file next to {shown!r} ({why}); choose a writable "
                          "directory on a real filesystem") from None
    os.close(fd)
    probe.unlink()
    return out


def write_failure(what: str, out: Path, exc: OSError) -> str:
    """One line for a write that failed after the checks (full disk, I/O error)."""
    return f"writing {what} to {str(out)!r} failed: {exc.strerror or exc}; nothing was written there"
