"""The CPU update's fused kernels (kernels/*.c): LayerNorm + SiLU forward and backward, and the
C51 output layer's loss, Q and gradients.

The C sources are compiled once per machine with the system's C compiler into a cache folder
(FASTSAC_KERNEL_CACHE, else $XDG_CACHE_HOME/fastsac or ~/.cache/fastsac, else the temp folder),
keyed by the source, the compiler and the CPU's flags, and loaded with ctypes: a call runs on the
calling thread and releases the GIL (so the twin critics' halves run their kernels in parallel).
Where no compiler works, or FASTSAC_CPU_KERNELS=0, the same mathematics runs as torch ops
(`kernels_in_use()` says which, with the reason).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from fastsac.algo.networks import categorical_projection

KERNELS = Path(__file__).with_name("kernels")
SOURCES = [KERNELS / "layer_norm_silu.c", KERNELS / "c51_head.c"]
# no -ffast-math: it links crtfastmath, which sets flush-to-zero for the whole process
_FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math", "-fno-math-errno", "-shared", "-fPIC"]
# tried in order: OpenMP (torch's own libgomp.so.1, already loaded: the same threads and counts as
# torch's) and the machine's vector extensions; then without each
_OPTIONAL_FLAGS = (["-fopenmp", "-march=native"], ["-march=native"], ["-fopenmp"], [])


class LayerNormSiLUSaved(NamedTuple):
    """What the backward needs from a forward: the normalized input, the SiLU's sigmoid, 1/std
    (flat for the C kernels, shaped for the torch ops)."""
    xhat: Tensor     # [rows, width]
    sig: Tensor      # [rows, width]
    rstd: Tensor     # [rows]


class _Library(NamedTuple):
    lib: ctypes.CDLL | None
    reason: str      # what runs and why


def _cache_dirs() -> list[Path]:
    """Where the compiled kernels may live, in order: FASTSAC_KERNEL_CACHE, else the user's cache
    ($XDG_CACHE_HOME or ~/.cache), then the temp folder (a unit with a read-only home)."""
    if os.environ.get("FASTSAC_KERNEL_CACHE"):
        return [Path(os.environ["FASTSAC_KERNEL_CACHE"])]
    dirs = []
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        dirs.append(Path(base) / "fastsac")
    except RuntimeError:       # no home directory
        pass
    return dirs + [Path(tempfile.gettempdir()) / f"fastsac-kernels-{os.getuid()}"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _compile(cc: str, out: Path) -> str | None:
    """Compile SOURCES into out (atomically: several processes may build at once); None if done."""
    error = "no attempt"
    for optional in _OPTIONAL_FLAGS:
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        try:
            run = subprocess.run([cc, *_FLAGS, *optional, "-o", str(tmp), *map(str, SOURCES)], capture_output=True,
                                 text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{cc}: {exc}"
        if run.returncode == 0:
            os.replace(tmp, out)
            return None
        tmp.unlink(missing_ok=True)
        error = (run.stderr.strip().splitlines() or ["failed"])[-1]
    return f"{cc}: {error}"


@functools.lru_cache(maxsize=1)
def _library() -> _Library:
    if os.environ.get("FASTSAC_CPU_KERNELS", "1") == "0":
        return _Library(None, "torch ops (FASTSAC_CPU_KERNELS=0)")
    cc = os.environ.get("CC", "cc")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _Library(None, f"torch ops (no C compiler: {exc})")
    texts = [f.read_text() for f in sorted(KERNELS.iterdir()) if f.suffix in (".c", ".h")]
    key = hashlib.sha256("\0".join([*texts, version, repr((_FLAGS, _OPTIONAL_FLAGS)), _cpu_flags()]).encode())
    lib, problems = None, []
    for folder in _cache_dirs():
        out = folder / f"update-kernels-{key.hexdigest()[:16]}.so"
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            if not out.exists() and (error := _compile(cc, out)) is not None:
                return _Library(None, f"torch ops (compiling {KERNELS} failed: {error})")
            lib = ctypes.CDLL(str(out))
            break
        except OSError as exc:
            problems.append(f"{out}: {exc}")
    if lib is None:
        return _Library(None, f"torch ops ({'; '.join(problems)})")
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.layer_norm_silu_forward.argtypes = [p, p, p, i64, i64, f32, p, p, p, p]
    lib.layer_norm_silu_backward.argtypes = [p, p, p, p, p, p, i64, i64, p, p, p, p]
    lib.c51_critic_head.argtypes = [p, p, p, p, i64, i64, f32, f32, f32, p, p, p]
    lib.c51_q_head.argtypes = [p, p, i64, i64, p, p]
    for fn in (lib.layer_norm_silu_forward, lib.layer_norm_silu_backward, lib.c51_q_head):
        fn.restype = None
    lib.c51_critic_head.restype = i64
    return _Library(lib, f"C kernels ({out})")


def kernels_in_use() -> str:
    """What runs the CPU update's fused kernels: 'C kernels (path)' or 'torch ops (why)'."""
    library = _library()
    if library.lib is None:
        warnings.warn(f"fastsac: the CPU update's kernels run as {library.reason}", stacklevel=2)
    return library.reason


def _usable(*tensors: Tensor) -> bool:
    return _library().lib is not None and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


def layer_norm_silu(z: Tensor, gamma: Tensor, beta: Tensor, eps: float,
                    save: bool) -> tuple[Tensor, LayerNormSiLUSaved | None]:
    """silu(layer_norm(z, gamma, beta)) over the last dim of a [rows, width] tensor; with save, also
    what layer_norm_silu_backward needs. No autograd: the callers backpropagate by hand. z is
    consumed: the C kernel writes the output over it (one allocation less per layer)."""
    rows, width = z.shape
    if not _usable(z, gamma, beta):
        return _torch_forward(z, gamma, beta, eps, save)
    saved = None
    if save:      # one allocation, flat views (the C kernels need no shapes)
        saved = LayerNormSiLUSaved(*z.new_empty(rows * (2 * width + 1)).split([rows * width, rows * width, rows]))
    ptrs = [t.data_ptr() for t in saved] if saved is not None else [None, None, None]
    _library().lib.layer_norm_silu_forward(z.data_ptr(), gamma.data_ptr(), beta.data_ptr(), rows, width, eps,
                                           z.data_ptr(), *ptrs)
    return z, saved


def layer_norm_silu_backward(dh: Tensor, saved: LayerNormSiLUSaved, gamma: Tensor,
                             beta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dz, dgamma, dbeta, dz.sum(0)) from dh = dL/dh of layer_norm_silu's output (dz's column sums
    are the gradient of the bias of the Linear that made z). dh is consumed: the C kernel writes dz
    over it."""
    if not _usable(dh, *saved, gamma, beta):
        return _torch_backward(dh, saved, gamma, beta)
    rows, width = dh.shape
    dgamma, dbeta, dz_sum = gamma.new_empty(3, width).unbind(0)
    _library().lib.layer_norm_silu_backward(dh.data_ptr(), saved.xhat.data_ptr(), saved.sig.data_ptr(),
                                            saved.rstd.data_ptr(), gamma.data_ptr(), beta.data_ptr(), rows,
                                            width, dh.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(),
                                            dz_sum.data_ptr())
    return dh, dgamma, dbeta, dz_sum


def c51_critic_head(target_logits: Tensor, logits: Tensor, target_atoms: Tensor, support: Tensor, v_min: float,
                    v_max: float, grad_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: the cross-entropy of softmax(logits) against softmax(target_logits) placed at
    target_atoms and projected onto the support (networks.categorical_projection), the expected
    value Q of softmax(logits), and grad_scale * d(cross-entropy)/d(logits). -> (loss [B], Q [B],
    dlogits [B, N])."""
    if not _usable(target_logits, logits, target_atoms, support):
        return _torch_critic_head(target_logits, logits, target_atoms, support, v_min, v_max, grad_scale)
    rows, n = logits.shape
    loss, q, dlogits = logits.new_empty(rows), logits.new_empty(rows), torch.empty_like(logits)
    nan_atoms = _library().lib.c51_critic_head(target_logits.data_ptr(), logits.data_ptr(), target_atoms.data_ptr(),
                                               support.data_ptr(), rows, n, v_min, v_max, grad_scale, loss.data_ptr(),
                                               q.data_ptr(), dlogits.data_ptr())
    if nan_atoms:    # as the torch ops' projection, which cannot index a NaN position either
        raise RuntimeError(f"c51_critic_head: {nan_atoms} NaN target atom(s) (NaN rewards, discounts or log-probs)")
    return loss, q, dlogits


def c51_q_head(logits: Tensor, support: Tensor) -> tuple[Tensor, Tensor]:
    """Per row: Q = the expected value of softmax(logits) on the support, and dQ/dlogits."""
    if not _usable(logits, support):
        probs = torch.softmax(logits, dim=-1)
        q = (probs * support).sum(-1)
        return q, probs * (support - q.unsqueeze(-1))
    rows, n = logits.shape
    q, dlogits = logits.new_empty(rows), torch.empty_like(logits)
    _library().lib.c51_q_head(logits.data_ptr(), support.data_ptr(), rows, n, q.data_ptr(), dlogits.data_ptr())
    return q, dlogits


def _torch_forward(z: Tensor, gamma: Tensor, beta: Tensor, eps: float,
                   save: bool) -> tuple[Tensor, LayerNormSiLUSaved | None]:
    mean = z.mean(-1, keepdim=True)
    rstd = torch.rsqrt((z - mean).square().mean(-1, keepdim=True) + eps)
    xhat = (z - mean) * rstd
    u = xhat * gamma + beta
    sig = torch.sigmoid(u)
    return u * sig, (LayerNormSiLUSaved(xhat, sig, rstd.squeeze(-1)) if save else None)


def _torch_backward(dh: Tensor, saved: LayerNormSiLUSaved, gamma: Tensor,
                    beta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    xhat, sig, rstd = saved
    u = xhat * gamma + beta
    du = dh * sig * (1 + u * (1 - sig))
    g = du * gamma
    dz = rstd.unsqueeze(-1) * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dz, (du * xhat).sum(0), du.sum(0), dz.sum(0)


def _torch_critic_head(target_logits: Tensor, logits: Tensor, target_atoms: Tensor, support: Tensor, v_min: float,
                       v_max: float, grad_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    target = categorical_projection(target_atoms, torch.softmax(target_logits, dim=-1), v_min, v_max)
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    dlogits = (probs * target.sum(-1, keepdim=True) - target) * grad_scale
    return -(target * log_probs).sum(-1), (probs * support).sum(-1), dlogits
