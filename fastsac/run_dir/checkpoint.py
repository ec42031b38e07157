"""Checkpoints: one `.pt` file per save, verified, written atomically, carrying no topology.

File: run_dir/checkpoints/ckpt_<run_id>-<save_seq>_<env_steps>.pt. Contents (a plain dict,
loadable with torch.load(weights_only=True)):
  format, format_version, run_id (the run that wrote it), save_seq (that run's save counter:
  the write order), saved_at (unix time, never smaller than the run's previous save),
  env_steps (transitions collected so far, all collectors together), env (name + dims),
  config (the job's config as a dict), agent (FastSAC.state_dict: networks, targets, both
  normalizers, log_alpha, optimizers, update counter), digest (sha256 over all of the above).

The file name only has to be unique; nothing is ever decided from it. Retention compares
run_id and save_seq read from the files, so a run never deletes another run's checkpoints nor
one it wrote later. A resumed run continues the run id of the checkpoint it resumed from (its
retention then covers that run's older files) with save_seq past every file of that run.

The synchronous trainer and the async learner write and read the same format, so either
resumes the other, from any collector count. Replay buffer and ring contents are not saved:
a resumed run refills its buffer.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import re
import secrets
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fastsac.common.procs import pid_alive

FORMAT = "fastsac-checkpoint"
# 1: no run id, save counter or checksum (refused: it cannot be verified); 2: networks of full width
# throughout and default-initialised actor heads (refused: its weights have other shapes)
FORMAT_VERSION = 3
_OLD_FORMATS = {1: "written by an older fastsac, without a checksum",
                2: "written by an older fastsac, whose networks kept every hidden layer at full width"}
CKPT_GLOB = "ckpt_*.pt"
TMP_PREFIX = ".tmp_ckpt_"   # + "<pid>_": a writer's temp file, renamed to ckpt_*.pt once verified
RUN_ID_RE = re.compile(r"^[0-9a-f]{8,32}$")
_NAME_RE = re.compile(r"^ckpt_(?P<run>[0-9a-f]+)-(?P<seq>\d+)_(?P<steps>\d+)\.pt$")
_HEADER_KEYS = ("agent", "env_steps", "env", "run_id", "save_seq", "saved_at", "digest")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, truncated, non-finite or incompatible)."""


class CheckpointSaveError(RuntimeError):
    """A save that did not happen (disk full, I/O error, a non-finite agent). Nothing was
    replaced or pruned: the previous checkpoints are all still there, and no temp file is left."""


def checkpoint_dir(run_path: Path) -> Path:
    return Path(run_path) / "checkpoints"


def new_run_id() -> str:
    return secrets.token_hex(4)


def checkpoint_name(run_id: str, save_seq: int, env_steps: int) -> str:
    return f"ckpt_{run_id}-{save_seq:06d}_{env_steps:014d}.pt"


# --------------------------------------------------------------------------- checksum

def _digest_and_nonfinite(payload: dict) -> tuple[str, list[str]]:
    """sha256 over the payload (without "digest") and the paths of non-finite float tensors.

    The checksum covers the structure and every value: an unambiguous length-prefixed encoding
    of dict keys, scalars and strings, and per tensor its dtype, shape and raw bytes (hashlib
    hashes ~1-2 GB/s and releases the GIL). Tensors are hashed where they lie, on the CPU.
    """
    import torch  # torch-free at import: the launcher checks run dirs without it

    h = hashlib.sha256()
    nonfinite: list[str] = []

    def put(tag: bytes, data: bytes = b"") -> None:
        h.update(tag + struct.pack("<Q", len(data)) + data)

    def walk(obj, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            put(b"T", f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
            # a finite sum proves every element finite (NaN/inf propagate); only an overflowing
            # sum needs the exact check (the sum runs ~20x faster than isfinite(t).all())
            if (t.is_floating_point() or t.is_complex()) and t.numel() and not bool(torch.isfinite(t.sum())) \
                    and not bool(torch.isfinite(t).all()):
                nonfinite.append(path)
        elif isinstance(obj, dict):
            put(b"d", struct.pack("<Q", len(obj)))
            for key, value in obj.items():
                walk(key, path)
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(obj, (list, tuple)):
            put(b"l" if isinstance(obj, list) else b"t", struct.pack("<Q", len(obj)))
            for i, value in enumerate(obj):
                walk(value, f"{path}[{i}]")
        elif obj is None:
            put(b"n")
        elif isinstance(obj, bool):
            put(b"b", b"1" if obj else b"0")
        elif isinstance(obj, int):
            put(b"i", str(obj).encode())
        elif isinstance(obj, float):
            put(b"f", struct.pack("<d", obj))
        elif isinstance(obj, str):
            put(b"s", obj.encode())
        elif isinstance(obj, bytes):
            put(b"y", obj)
        else:
            raise TypeError(f"cannot checksum a {type(obj).__name__} at {path or 'the top'}")

    walk({k: v for k, v in payload.items() if k != "digest"}, "")
    return "sha256:" + h.hexdigest(), nonfinite


def payload_digest(payload: dict) -> str:
    """The checksum stored as payload["digest"] (everything but that field)."""
    return _digest_and_nonfinite(payload)[0]


# --------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class CheckpointHeader:
    """Who wrote a file and when (read without verifying the checksum: cheap, but untrusted)."""
    path: Path
    run_id: str
    save_seq: int
    saved_at: float
    env_steps: int


def _torch_load(p: Path, mmap: bool = False) -> dict:
    import torch  # torch-free at import: the launcher checks run dirs without it
    try:
        # mmap: only the pickled structure is read; tensor bytes are paged in when touched
        return torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # truncated zip, random bytes, pickle errors: all mean "unusable"
        raise CheckpointError(_unusable(p, exc)) from None


def _unusable(p: Path, exc: Exception) -> str:
    """Why torch.load failed, in one line. torch's weights-only loader wraps its reason in advice to
    load with weights_only=False, which would run whatever code the file holds: only the reason
    is kept, and a refused object (a malicious pickle) is named as such."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError):
        refused = re.search(r"GLOBAL [\w.]+", text)
        if refused:
            return (f"checkpoint {str(p)!r} is not a fastsac checkpoint: it holds Python objects no checkpoint holds "
                    f"({refused.group(0)}); it was not loaded, and no code in it ran (fastsac loads only tensors and "
                    "plain values)")
        text = " ".join(part.strip() for part in text.split("\n\n") if part.strip() and "weights_only" not in part
                        and not part.strip().startswith(("Weights only load failed", "Check the documentation")))
    return f"checkpoint {str(p)!r} is corrupt or truncated ({type(exc).__name__}: {' '.join(text.split())})"


def _check_format(payload, p: Path) -> CheckpointHeader:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(p)!r} is not a fastsac checkpoint")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        old = f" ({_OLD_FORMATS[version]})" if version in _OLD_FORMATS else ""
        raise CheckpointError(f"checkpoint {str(p)!r} has format version {version!r}{old}; "
                              f"this fastsac reads version {FORMAT_VERSION}")
    for key in _HEADER_KEYS:
        if key not in payload:
            raise CheckpointError(f"checkpoint {str(p)!r} lacks the field {key!r}")
    run_id, seq, at, steps = payload["run_id"], payload["save_seq"], payload["saved_at"], payload["env_steps"]
    if not (isinstance(run_id, str) and RUN_ID_RE.match(run_id) and isinstance(seq, int)
            and isinstance(at, float) and isinstance(steps, int)):
        raise CheckpointError(f"checkpoint {str(p)!r} is corrupt (malformed run_id/save_seq/saved_at/env_steps)")
    return CheckpointHeader(p, run_id, seq, at, steps)


def read_header(path: str | Path) -> CheckpointHeader:
    p = Path(path)
    return _check_format(_torch_load(p, mmap=True), p)


def _verify(payload: dict, p: Path) -> None:
    digest, nonfinite = _digest_and_nonfinite(payload)
    if digest != payload["digest"]:
        raise CheckpointError(f"checkpoint {str(p)!r} is corrupt: its checksum does not match its contents "
                              f"(stored {str(payload['digest'])[:23]}..., computed {digest[:23]}...)")
    if nonfinite:
        more = f" and {len(nonfinite) - 3} more" if len(nonfinite) > 3 else ""
        raise CheckpointError(f"checkpoint {str(p)!r} holds non-finite values (NaN/inf) in "
                              f"{', '.join(nonfinite[:3])}{more}; refusing to load it")


def to_device(obj, device: str):
    """obj with every tensor moved to device (nested dicts, lists, tuples)."""
    if hasattr(obj, "to") and hasattr(obj, "device"):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def load_checkpoint(path: str | Path, map_location: str = "cpu", mmap: bool = False) -> dict:
    """Load, check the format, verify the checksum and refuse non-finite tensors (all on the
    CPU), then move the tensors to map_location. Any problem: CheckpointError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    payload = _torch_load(p, mmap=mmap)
    _check_format(payload, p)
    try:
        _verify(payload, p)
    except (TypeError, RuntimeError, OSError) as exc:  # a shape the pickle should never hold, a short read
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint {str(p)!r} is corrupt ({type(exc).__name__}: {exc})") from None
    return payload if map_location == "cpu" else to_device(payload, map_location)


def scan_headers(run_path: Path, log=print) -> list[CheckpointHeader]:
    """Headers of every readable checkpoint in run_path, newest write first; unreadable files
    are reported (with their path) and left alone."""
    headers = []
    for p in sorted(checkpoint_dir(run_path).glob(CKPT_GLOB)):
        try:
            headers.append(read_header(p))
        except CheckpointError as exc:
            log(f"resume: skipping {exc}")
    # saved_at orders runs; save_seq breaks ties (and agrees with saved_at within a run)
    return sorted(headers, key=lambda h: (h.saved_at, h.save_seq), reverse=True)


def newest_valid(run_path: Path, log=print) -> tuple[Path, dict] | None:
    """The newest checkpoint (by write time) in run_path that verifies, with its payload;
    corrupt ones are reported with their path, skipped and never touched."""
    for header in scan_headers(run_path, log):
        try:
            return header.path, load_checkpoint(header.path)
        except CheckpointError as exc:
            log(f"resume: skipping {exc}")
    return None


def find_resume(resume: str, run_path: Path, log=print) -> tuple[Path, dict] | None:
    """Map the `resume` config value to (path, verified payload); None = fresh start."""
    if not resume:
        return None
    if resume == "auto":
        found = newest_valid(run_path, log)
        if found is None:
            log(f"resume: no valid checkpoint in {checkpoint_dir(run_path)}, starting fresh")
        return found
    return Path(resume), load_checkpoint(resume)


def check_compatible(payload: dict, env_name: str, obs_dim: int, critic_obs_dim: int, act_dim: int, path) -> None:
    env = payload["env"]
    mine = {"name": env_name, "obs_dim": obs_dim, "critic_obs_dim": critic_obs_dim, "act_dim": act_dim}
    for key, value in mine.items():
        if env.get(key) != value:
            raise CheckpointError(f"checkpoint {str(path)!r} was trained with env {key}={env.get(key)!r}, "
                                  f"but this job has {key}={value!r}")


# --------------------------------------------------------------------------- writing

def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu(obj):
    """The payload with every tensor on the CPU: hashed and written from the same host copy."""
    if hasattr(obj, "device") and hasattr(obj, "cpu"):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return type(obj)((k, _cpu(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


class RunCheckpoints:
    """The checkpoints one run writes into one run_dir: its identity, write order and retention.

    save(): temp file + fsync, read back and verify the checksum, rename, directory fsync; only
    then prune. Retention keeps the `keep` newest *valid* files of this run by save_seq: the file
    just written is always one of them, a file of another run (or one this run cannot verify)
    is never deleted, and nothing newer than the new file exists in this run by construction.
    """

    def __init__(self, run_path: Path, keep: int, run_id: str, next_seq: int = 1, last_saved_at: float = 0.0,
                 log=print):
        self.run_path, self.keep, self.run_id = Path(run_path), keep, run_id
        self.next_seq, self.last_saved_at, self.log = next_seq, last_saved_at, log
        self.resumed_at: int | None = None    # the env step of the checkpoint this run resumed from
        self._checked: dict[Path, tuple[tuple, CheckpointHeader | None]] = {}  # path -> (stat key, verdict)

    @classmethod
    def fresh(cls, run_path: Path, keep: int, log=print) -> "RunCheckpoints":
        return cls(run_path, keep, new_run_id(), log=log)

    @classmethod
    def resumed(cls, run_path: Path, keep: int, path: Path, payload: dict, log=print) -> "RunCheckpoints":
        """Continue the run of `payload`: its run id, save_seq past every file of that run here
        (headers are untrusted, but they can only raise the counters)."""
        run = cls(run_path, keep, payload["run_id"], payload["save_seq"] + 1, payload["saved_at"], log)
        run.resumed_at = int(payload["env_steps"])
        for h in scan_headers(run_path, log=lambda m: None):
            if h.run_id == run.run_id:
                run.next_seq = max(run.next_seq, h.save_seq + 1)
                run.last_saved_at = max(run.last_saved_at, h.saved_at)
        # an unreadable file of this run keeps its number too (only ever raises the counter)
        for p in checkpoint_dir(run_path).glob(CKPT_GLOB):
            m = _NAME_RE.match(p.name)
            if m and m["run"] == run.run_id:
                run.next_seq = max(run.next_seq, int(m["seq"]) + 1)
        run._remember(Path(path), _check_format(payload, Path(path)))
        return run

    # ---- save
    def save(self, payload: dict) -> Path:
        """Write payload (agent, env_steps, env, config) as this run's next checkpoint.

        Raises CheckpointSaveError when it could not be written (the previous ones are kept)."""
        import torch  # torch-free at import: the launcher checks run dirs without it

        directory = checkpoint_dir(self.run_path)
        env_steps = int(payload["env_steps"])
        seq = self.next_seq
        final = directory / checkpoint_name(self.run_id, seq, env_steps)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._remove_dead_writers_temp_files(directory)
            while final.exists():  # an unreadable file of this run's earlier process: names stay unique
                seq += 1
                final = directory / checkpoint_name(self.run_id, seq, env_steps)
        except OSError as exc:
            raise CheckpointSaveError(f"checkpoint {final} not saved: {exc}; the previous checkpoints are kept") from None
        self.next_seq = seq + 1
        saved_at = max(time.time(), self.last_saved_at + 1e-6)  # monotonic within the run
        full = dict(_cpu(payload), format=FORMAT, format_version=FORMAT_VERSION, run_id=self.run_id,
                    save_seq=seq, saved_at=saved_at, env_steps=env_steps)
        full["digest"], nonfinite = _digest_and_nonfinite(full)
        if nonfinite:
            raise CheckpointSaveError(f"checkpoint {final} not saved: the agent holds non-finite values (NaN/inf) "
                                      f"in {', '.join(nonfinite[:3])}; the previous checkpoints are kept")
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.getpid()}_", suffix=".pt", dir=directory)
            with os.fdopen(fd, "wb") as f:
                torch.save(full, f)
                f.flush()
                os.fsync(f.fileno())
            written = load_checkpoint(tmp, mmap=True)   # what the disk gives back must be what we sent
            if written["digest"] != full["digest"]:
                raise CheckpointError(f"read back with checksum {written['digest'][:23]}..., "
                                      f"sent {full['digest'][:23]}...")
            del written
            os.replace(tmp, final)
            tmp = None
            fsync_dir(directory)
        except (OSError, RuntimeError) as exc:   # RuntimeError: torch's writer, CheckpointError
            reason = f"the written file does not verify: {exc}" if isinstance(exc, CheckpointError) else str(exc)
            raise CheckpointSaveError(f"checkpoint {final} not saved: {reason}; "
                                      "the previous checkpoints are kept") from None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        self.last_saved_at = saved_at
        self._remember(final, CheckpointHeader(final, self.run_id, seq, saved_at, env_steps))
        self._prune(directory, final, seq)
        return final

    # ---- retention
    def _prune(self, directory: Path, final: Path, seq: int) -> None:
        older = []
        for p in directory.glob(CKPT_GLOB):
            if p == final:
                continue
            h = self._verified_header(p)
            if h is not None and h.run_id == self.run_id and h.save_seq < seq:
                older.append(h)
        older.sort(key=lambda h: h.save_seq)
        for h in older[:max(0, len(older) - (self.keep - 1))]:
            try:
                h.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.log(f"checkpoint: could not remove {h.path} ({exc}); it stays")
            self._checked.pop(h.path, None)

    def _verified_header(self, p: Path) -> CheckpointHeader | None:
        """The header of a file, None when it cannot be trusted (reported once). Files of this run
        are verified in full (they are the ones pruning may delete); a file of another run costs
        one header read. Each file is looked at once per process, again only when it changes."""
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._checked.get(p)
        if known is not None and known[0] == key:
            return known[1]
        verdict = None
        try:
            header = read_header(p)
            if header.run_id == self.run_id:    # only files of this run are ever candidates to prune
                load_checkpoint(p, mmap=True)
            verdict = header
        except CheckpointError as exc:
            self.log(f"checkpoint retention: {exc}; it is left in place and does not count towards checkpoint.keep")
        self._checked[p] = (key, verdict)
        return verdict

    def _remember(self, p: Path, header: CheckpointHeader) -> None:
        try:
            st = p.stat()
        except OSError:
            return
        self._checked[p] = ((st.st_ino, st.st_size, st.st_mtime_ns), header)

    @staticmethod
    def _remove_dead_writers_temp_files(directory: Path) -> None:
        """A process killed mid-save leaves its temp file (named after its pid) behind: remove
        those of dead writers, never one that a live process may still be writing."""
        for leftover in directory.glob(TMP_PREFIX + "*"):
            pid = leftover.name[len(TMP_PREFIX):].split("_")[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                leftover.unlink(missing_ok=True)
