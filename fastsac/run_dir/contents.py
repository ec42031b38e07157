"""What a run_dir holds, and which run may write into it: one training lineage per run_dir
(torch-free: the launcher runs these checks before it spawns or creates anything).

    checkpoints/ckpt_*.pt   the checkpoints (fastsac.run_dir.checkpoint)
    metrics.jsonl, tb/      the scalars (fastsac.training.telemetry)
    logs/                   every process's log (logs/numa-check.*: --check-numa's reports, no run's output)
    wandb/                  Weights & Biases' files (fastsac.training.wandb_sink)
    .fastsac.lock           the lock of the job running in it (fastsac.run_dir.lock)

A lineage is one run id, continued across resumes. A fresh run (resume '') needs a run_dir
without any run output: appending to a killed run's metrics or TensorBoard files mixes two runs
as surely as sharing checkpoints does. `resume=<path>` continues the file's run, so the run_dir
must hold nothing of another run (or nothing at all): starting run B's run_dir from run A's
checkpoint would put A's lineage beside B's. `resume=auto` continues the run_dir's own run.
"""
from __future__ import annotations

import collections
import errno
import io
import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fastsac.config import ConfigError
from fastsac.run_dir.checkpoint import CKPT_GLOB, checkpoint_dir
from fastsac.run_dir.lock import LOCK_NAME

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
LOGS_DIR = "logs"
WANDB_DIR = "wandb"
NUMA_CHECK_PREFIX = "numa-check."     # logs/numa-check.<hex>/: what --check-numa writes (it trains nothing)
OWN_FILES = (METRICS_FILE, LOCK_NAME)  # the run's files directly in run_dir ...
OWN_DIRS = (checkpoint_dir(Path()).name, TB_DIR, LOGS_DIR, WANDB_DIR)   # ... and its folders
PEEK_MAX_BYTES = 64 * 2**20           # a checkpoint's pickled structure is a few hundred kB


@dataclass(frozen=True)
class Lineage:
    """The run a trainer continues in its run_dir: its id, and the env step of the checkpoint it
    resumed from (None: a fresh start, nothing of an earlier start continues)."""
    run_id: str
    resumed_at: int | None


def run_outputs(run_path: Path) -> list[str]:
    """The run output in run_path, as names relative to it (checkpoint files one by one, folders
    with their file count); [] for a run_dir a fresh run may use. The lock file and --check-numa's
    reports are no run's output; an empty file holds nothing to mix with."""
    run_path = Path(run_path)
    found = [f"{OWN_DIRS[0]}/{p.name}" for p in sorted(checkpoint_dir(run_path).glob(CKPT_GLOB))]
    metrics = run_path / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size:
        found.append(METRICS_FILE)
    for name in (TB_DIR, LOGS_DIR, WANDB_DIR):
        folder = run_path / name
        files = [p for p in folder.rglob("*") if p.is_file() and p.stat().st_size
                 and not (name == LOGS_DIR and p.relative_to(folder).parts[0].startswith(NUMA_CHECK_PREFIX))] \
            if folder.is_dir() else []
        if files:
            found.append(f"{name}/ ({len(files)} file{'s' if len(files) > 1 else ''})")
    return found


def resolved(key: str, path: str | Path) -> Path:
    """path with every symlink followed; ConfigError naming `key` and the path when a symbolic link
    loop (or another error of the lookup) makes that impossible, instead of an ELOOP traceback."""
    try:
        return Path(path).resolve(strict=False)
    except (RuntimeError, OSError) as exc:   # RuntimeError: Python < 3.13's report of a symlink loop
        loop = isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP
        why = "it is, or passes through, a symbolic link loop (Too many levels of symbolic links)" if loop \
            else exc.strerror
        raise ConfigError(f"{key}: {str(path)!r} cannot be used: {why}; give a path without one") from None


def own_file_of_a_run(path: Path) -> Path | None:
    """The run_dir whose own file (metrics, TensorBoard, logs, W&B, lock, checkpoints) `path`
    (resolved) is, else None. A directory is a run_dir when it holds a run's lock or checkpoints
    (a folder of the user's that happens to be called checkpoints or logs makes none)."""
    path = Path(path)
    for run in path.parents:
        if not ((run / LOCK_NAME).exists() or any(checkpoint_dir(run).glob(CKPT_GLOB))):
            continue
        inside = path.relative_to(run).parts
        if (len(inside) == 1 and inside[0] in OWN_FILES) or (len(inside) > 1 and inside[0] in OWN_DIRS):
            return run
    return None


class _Opaque:
    """Whatever a checkpoint's pickle builds besides plain containers (tensors, torch types): a
    stand-in that runs nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setitem__(self, key, value):
        pass

    def __setstate__(self, state):
        pass


class _HeaderUnpickler(pickle.Unpickler):
    def find_class(self, module, name):   # no global of the file is ever looked up
        return collections.OrderedDict if (module, name) == ("collections", "OrderedDict") else _Opaque

    def persistent_load(self, pid):       # tensor storages: not read
        return None


def peek_run_id(path: Path) -> str | None:
    """The run id a checkpoint file says it belongs to, read without torch and without verifying
    it (None when the file is no readable checkpoint: loading it refuses it then, with the reason)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pkl = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
            if len(pkl) != 1 or pkl[0].file_size > PEEK_MAX_BYTES:
                return None
            payload = _HeaderUnpickler(io.BytesIO(archive.read(pkl[0]))).load()
    except Exception:   # not a zip, a truncated one, a pickle that is no checkpoint's: all "unknown"
        return None
    run_id = payload.get("run_id") if isinstance(payload, dict) else None
    return run_id if isinstance(run_id, str) else None


def metrics_run_ids(run_path: Path) -> set[str]:
    """The run ids metrics.jsonl's rows carry (rows of an older fastsac carry none)."""
    ids = set()
    try:
        with open(Path(run_path) / METRICS_FILE) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("run_id"), str):
                    ids.add(row["run_id"])
    except OSError:
        pass
    return ids


def run_ids(run_path: Path) -> set[str]:
    """Every run id run_path's checkpoints and metrics name."""
    found = {peek_run_id(p) for p in checkpoint_dir(run_path).glob(CKPT_GLOB)} | metrics_run_ids(run_path)
    return found - {None}


def _shown(outputs: list[str]) -> str:
    return ", ".join(outputs[:4]) + (f" and {len(outputs) - 4} more" if len(outputs) > 4 else "")


def check_run_dir_lineage(run_path: Path, resume: str) -> None:
    """ConfigError (exit 2) when this launch would put a second run into run_path: a fresh run
    into a run_dir with any run output, or resume=<path> of a run other than the run_dir's."""
    run_path = Path(run_path)
    if resume == "auto":
        return
    outputs = run_outputs(run_path)
    if not outputs:
        return
    if not resume:
        ids = sorted(run_ids(run_path))
        raise ConfigError(
            f"run_dir: {str(run_path)!r} already holds the output of an earlier run"
            f"{' (run id ' + ', '.join(ids) + ')' if ids else ''}: {_shown(outputs)}; this launch would start a "
            "fresh run (resume is '') and mix the two. Continue that run with resume=auto, start from one of its "
            "files with resume=<path>, or give this run a new run_dir")
    theirs, mine = run_ids(run_path), peek_run_id(Path(resume))
    if mine is None or theirs == {mine}:
        return    # the run_dir's own run (an unreadable file is refused when it is loaded)
    whose = f"run {', '.join(sorted(theirs - {mine}))}" if theirs - {mine} else "a run without checkpoints"
    raise ConfigError(
        f"resume: {resume!r} is a checkpoint of run {mine}, but run_dir {str(run_path)!r} holds the output of "
        f"{whose} ({_shown(outputs)}); one run_dir holds one run. Resume run {mine} in a new run_dir "
        f"(run_dir=<new directory> resume={resume}), or with resume=auto in its own run_dir")
