"""`fastsac-export CHECKPOINT --format torchscript|onnx OUT`: the trained policy as one file that
runs without fastsac.

The exported actor is the trainer's deterministic act path, nothing else:

    action = tanh(mean_head(trunk((obs - mean) * rsqrt(var + eps)))) * action_scale + action_bias

raw observations [B, obs_dim] float32 in (B dynamic, >= 1), env-scaled actions [B, act_dim]
float32 out. The observation normalizer's statistics are frozen into constants (their values in
the checkpoint); the action bounds are the env's (they are not trained, so not in the checkpoint:
the env named in the checkpoint is built once to read them). `fastsac-eval` acts with the same
module, so what it measures is what is exported.

TorchScript needs torch only; ONNX goes through torch.onnx.export (the dynamo exporter) and
needs the extra fastsac[export] (onnx, onnxscript, onnxruntime). Every written file is loaded
back and checked against the module before it is moved into place: a failed export leaves
nothing behind (fastsac.tools.outputs: OUT is never a checkpoint, nor inside a run's
checkpoints/). Exit codes: 0 written, 1 the written file did not reproduce the actor or could
not be written (a full disk), 2 bad input (missing/corrupt checkpoint, missing extra, unusable OUT).
"""
from __future__ import annotations

import argparse
import copy
import importlib
import io
import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn

from fastsac.algo.networks import Actor
from fastsac.algo.normalizer import RunningNormalizer
from fastsac.common.command_line import EXIT_CODES_HELP, UsageParser, quiet_broken_pipe
from fastsac.config import Config, config_from_dict
from fastsac.envs.registry import make_env
from fastsac.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError
from fastsac.run_dir.checkpoint import CheckpointError, load_checkpoint, newest_valid
from fastsac.shm_layout.policy_layout import actor_widths
from fastsac.tools.outputs import check_output, temp_path, write_failure

FORMATS = ("torchscript", "onnx")
SUFFIXES = {"torchscript": (".pt", ".ts"), "onnx": (".onnx",)}   # OUT's extension must name its format
EXPORT_EXTRA_HINT = "pip install 'fastsac[export]'"
ONNX_MODULES = ("onnx", "onnxscript", "onnxruntime")   # the exporter needs the first two, the check the third
ONNX_OPSET = 18
INPUT_NAME, OUTPUT_NAME = "obs", "action"
METADATA_KEY = "fastsac.json"       # TorchScript extra file / ONNX metadata_props key
CONTRACT_VERSION = 1
# the check of a written file: exported vs in-memory actor on CHECK_ROWS observations
CHECK_ROWS, CHECK_ATOL, CHECK_RTOL = 64, 1e-5, 1e-5


class DeterministicActor(nn.Module):
    """Raw observation -> env action: the normalizer, the actor's trunk and mean head, tanh, the
    action scaling. Only constants and the ops above, so TorchScript and ONNX see the same graph."""

    def __init__(self, actor: Actor, normalizer: RunningNormalizer):
        super().__init__()
        self.obs_dim, self.act_dim = actor.obs_dim, actor.act_dim
        self.trunk = copy.deepcopy(actor.trunk)
        self.mean_head = copy.deepcopy(actor.mean_head)
        with torch.no_grad():
            if normalizer.enabled:   # the same expression as RunningNormalizer.forward, evaluated once
                mean, inv_std = normalizer.mean.clone(), torch.rsqrt(normalizer.var + normalizer.eps)
            else:
                mean, inv_std = torch.zeros(self.obs_dim), torch.ones(self.obs_dim)
        self.register_buffer("obs_mean", mean.float())
        self.register_buffer("obs_inv_std", inv_std.float())
        self.register_buffer("action_scale", actor.action_scale.clone())
        self.register_buffer("action_bias", actor.action_bias.clone())
        self.requires_grad_(False).eval()

    def forward(self, obs: Tensor) -> Tensor:
        # deterministic Actor.sample: u = mean + std * 0, a = tanh(u); then Actor.to_env
        unit = torch.tanh(self.mean_head(self.trunk((obs - self.obs_mean) * self.obs_inv_std)).float())
        return unit * self.action_scale + self.action_bias


@dataclass
class TrainedPolicy:
    """A verified checkpoint's policy and where it came from."""
    path: Path
    payload: dict
    cfg: Config
    actor: DeterministicActor

    @property
    def env(self) -> dict:
        return self.payload["env"]

    def describe(self) -> str:
        return (f"{self.path} (run {self.payload['run_id']}, env step {self.payload['env_steps']:,}, "
                f"trained on {self.env['name']})")


def resolve_checkpoint(arg: str) -> tuple[Path, dict]:
    """A .pt file, or a run_dir (its newest valid checkpoint); loaded and verified.
    CheckpointError names the file and what is wrong."""
    p = Path(arg)
    if p.is_dir():
        found = newest_valid(p, log=lambda m: print(f"note: {m}", file=sys.stderr))
        if found is None:
            raise CheckpointError(f"{str(p)!r} is a directory without a valid checkpoint in "
                                  f"{str(p / 'checkpoints')!r}; give a checkpoint file or a run_dir")
        return found
    return p, load_checkpoint(p)


def trained_config(path: Path, payload: dict) -> Config:
    try:
        return config_from_dict(payload.get("config"))
    except ConfigError as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} carries a job config this fastsac cannot read: {exc}") from None


def load_policy(path: Path, payload: dict, cfg: Config, action_low: np.ndarray,
                action_high: np.ndarray) -> TrainedPolicy:
    """The deterministic actor of a verified payload, scaled to the given action bounds."""
    agent, env = payload["agent"], payload["env"]
    a = cfg.algo
    try:
        actor = Actor(env["obs_dim"], env["act_dim"], actor_widths(a), a.log_std_min,
                      a.log_std_max, action_low, action_high)
        actor.load_state_dict(agent["actor"])
        normalizer = RunningNormalizer(env["obs_dim"], enabled=a.obs_normalization)
        normalizer.load_state_dict(agent["obs_normalizer"])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r} holds no actor that fits its own config and env "
                              f"({type(exc).__name__}: {exc})") from None
    return TrainedPolicy(path, payload, cfg, DeterministicActor(actor, normalizer))


def env_action_bounds(name: str, max_episode_steps: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(action_low, action_high, obs_dim, act_dim) of a task, read off a one-env instance."""
    env = make_env(name, 1, seed=0, max_episode_steps=max_episode_steps)
    try:
        return np.asarray(env.action_low, np.float32), np.asarray(env.action_high, np.float32), env.obs_dim, env.act_dim
    finally:
        env.close()


def check_env_dims(policy_env: dict, name: str, obs_dim: int, act_dim: int, path: Path) -> None:
    """ConfigError unless the env the actor is run on has the trained observation and action sizes."""
    want = (policy_env["obs_dim"], policy_env["act_dim"])
    if (obs_dim, act_dim) != want:
        raise ConfigError(f"env {name!r} has obs_dim={obs_dim}, act_dim={act_dim}, but checkpoint {str(path)!r} "
                          f"was trained on {policy_env['name']!r} with obs_dim={want[0]}, act_dim={want[1]}")


def load_for_env(checkpoint: str, env_name: str | None = None) -> tuple[TrainedPolicy, str, int]:
    """Checkpoint + the env to act in (default: the one it was trained on) -> (policy scaled to that
    env's action bounds, env name, max_episode_steps to build it with). The trained max_episode_steps
    is kept for the trained env; another env gets its own default."""
    path, payload = resolve_checkpoint(checkpoint)
    cfg = trained_config(path, payload)
    name = env_name or payload["env"]["name"]
    steps = cfg.env.max_episode_steps if name == payload["env"]["name"] else 0
    try:
        low, high, obs_dim, act_dim = env_action_bounds(name, steps)
    except ConfigError as exc:
        raise ConfigError(f"--env-name: {exc}" if env_name else str(exc)) from None
    check_env_dims(payload["env"], name, obs_dim, act_dim, path)
    return load_policy(path, payload, cfg, low, high), name, steps


# --------------------------------------------------------------------------- writing

def metadata(policy: TrainedPolicy) -> dict:
    """What the exported file says about itself (TorchScript: extra file, ONNX: metadata_props)."""
    a = policy.actor
    return {"format": "fastsac-actor", "contract_version": CONTRACT_VERSION, "input": INPUT_NAME,
            "output": OUTPUT_NAME, "env": policy.env["name"], "obs_dim": a.obs_dim, "act_dim": a.act_dim,
            "action_low": (a.action_bias - a.action_scale).tolist(),
            "action_high": (a.action_bias + a.action_scale).tolist(),
            "checkpoint": {"run_id": policy.payload["run_id"], "save_seq": policy.payload["save_seq"],
                           "env_steps": policy.payload["env_steps"]}}


def missing_onnx_modules() -> list[str]:
    missing = []
    for name in ONNX_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def check_observations(actor: DeterministicActor, rows: int = CHECK_ROWS) -> Tensor:
    """Observations around the trained statistics (mean +- 3 std), seeded: the check is repeatable."""
    g = torch.Generator().manual_seed(0)
    std = 1.0 / actor.obs_inv_std
    return actor.obs_mean + 3.0 * std * (2.0 * torch.rand(rows, actor.obs_dim, generator=g) - 1.0)


def _write_file(path: Path, data: bytes) -> None:
    """data to path, synced: a full disk is an OSError here (torch's own C++ writer aborts the
    process on one, so the archive is built in memory and written by Python)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_torchscript(actor: DeterministicActor, meta: dict, out: Path) -> Callable[[Tensor], Tensor]:
    scripted = torch.jit.script(actor)
    archive = io.BytesIO()
    torch.jit.save(scripted, archive, _extra_files={METADATA_KEY: json.dumps(meta)})
    _write_file(out, archive.getvalue())
    loaded = torch.jit.load(str(out), map_location="cpu")
    return lambda obs: loaded(obs)


def _write_onnx(actor: DeterministicActor, meta: dict, out: Path) -> Callable[[Tensor], Tensor]:
    import onnx  # the optional export extra
    import onnxruntime  # the optional export extra

    example = torch.zeros(2, actor.obs_dim)   # batch 2: a batch of 1 would be specialized away
    batch = torch.export.Dim("batch", min=1)
    # the exporter logs and warns about its own internals (torchvision ops it skips, deprecations): not ours
    onnx_log = logging.getLogger("torch.onnx")
    level = onnx_log.level
    onnx_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.onnx.export(actor, (example,), str(out), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_shapes={"obs": {0: batch}}, opset_version=ONNX_OPSET, dynamo=True,
                              external_data=False, verbose=False)
    finally:
        onnx_log.setLevel(level)
    model = onnx.load(str(out))
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta)
    _write_file(out, model.SerializeToString())
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return lambda obs: torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: obs.numpy()})[0])


def export(policy: TrainedPolicy, fmt: str, out: Path) -> float:
    """Write the actor to out (atomically) and return the largest |exported - actor| seen on the
    check observations; RuntimeError when it exceeds the tolerance, OSError when the write fails
    (either way nothing is left at out, and no temp file)."""
    tmp = temp_path(out)
    try:
        run = (_write_torchscript if fmt == "torchscript" else _write_onnx)(policy.actor, metadata(policy), tmp)
        obs = check_observations(policy.actor)
        with torch.no_grad():
            want = policy.actor(obs)
            got = run(obs)
        err = float((got - want).abs().max())
        if got.shape != want.shape or not torch.allclose(got, want, atol=CHECK_ATOL, rtol=CHECK_RTOL):
            raise RuntimeError(f"the written {fmt} file does not reproduce the actor (max |difference| {err:.3g}, "
                               f"shape {tuple(got.shape)} vs {tuple(want.shape)}); nothing was written to {out}")
        os.replace(tmp, out)
        tmp = None
        return err
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- CLI

def add_checkpoint_arg(p: argparse.ArgumentParser) -> None:
    """The positional checkpoint argument of every tool that reads a run."""
    p.add_argument("checkpoint", help="a checkpoint file (ckpt_*.pt), or a run_dir (its newest valid checkpoint)")


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="fastsac-export",
                    description="Export a checkpoint's deterministic actor (observation normalizer and action "
                                "scaling included) as TorchScript or ONNX: raw observations [B, obs_dim] float32 "
                                "in, env actions [B, act_dim] out.",
                    epilog=EXIT_CODES_HELP)
    add_checkpoint_arg(p)
    p.add_argument("--format", required=True, choices=FORMATS,
                   help=f"torchscript (torch only) or onnx (needs {EXPORT_EXTRA_HINT})")
    p.add_argument("out", help="the file to write: .pt or .ts (torchscript), .onnx (onnx); its directory must "
                               "exist; never a checkpoint or a run's own file (metrics, TensorBoard, logs, "
                               "checkpoints/)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists (never a checkpoint or a run's "
                                                         "own file)")
    return p


def check_suffix(fmt: str, out: Path) -> None:
    """OUT's extension names its format: a TorchScript archive written to actor.onnx (or over
    metrics.jsonl) is a file nobody can tell apart until it fails to load."""
    if out.suffix not in SUFFIXES[fmt]:
        raise ConfigError(f"out: {str(out)!r} does not end in {' or '.join(SUFFIXES[fmt])}, the extension of a "
                          f"--format {fmt} file; e.g. actor{SUFFIXES[fmt][0]}")


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    out = Path(args.out)
    try:
        check_suffix(args.format, out)
        if args.format == "onnx" and (missing := missing_onnx_modules()):
            raise ConfigError(f"--format onnx needs {', '.join(ONNX_MODULES)}; missing: {', '.join(missing)}. "
                              f"Install them with: {EXPORT_EXTRA_HINT}")
        policy, _, _ = load_for_env(args.checkpoint)
        check_output("out", out, reads=(policy.path,), replace=args.force)
    except (CheckpointError, ConfigError) as exc:
        print(f"fastsac-export: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        err = export(policy, args.format, out)
    except RuntimeError as exc:
        print(f"fastsac-export: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:    # a full disk, an I/O error: after every check, so a runtime failure
        print(f"fastsac-export: error: {write_failure(args.format + ' file', out, exc)}", file=sys.stderr)
        return EXIT_FAILURE
    a = policy.actor
    print(f"fastsac-export: wrote {out} ({args.format}): {policy.describe()}; "
          f"{INPUT_NAME} [B, {a.obs_dim}] float32 -> {OUTPUT_NAME} [B, {a.act_dim}] float32 "
          f"(checked on {CHECK_ROWS} observations, max |difference| {err:.2g})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
