"""fastsac-export through its CLI: the exported TorchScript / ONNX actor gives the trainer's
deterministic actions (FastSAC.act(..., deterministic=True)) on real env observations, at any
batch size; bad input is exit 2 with nothing written.

Checkpoints are written by the run's own save path (fastsac.training.state.save) from a FastSAC agent
whose observation normalizer has non-trivial statistics, so a normalizer left out or applied
twice would show.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from support.checkpoint_bytes import flip_tensor_bytes
from support.cli_batch import run_mains
from support.export_checkpoints import make_checkpoint

from fastsac.envs.registry import make_env

TASKS = ["pendulum", "halfcheetah"]
# torch deprecates TorchScript in favour of torch.export, but still loads it; the format is asked for
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
ATOL = 1e-5


def needs(task: str) -> None:
    if task == "halfcheetah":
        pytest.importorskip("mujoco", reason="halfcheetah needs the mujoco extra (pip install 'fastsac[mujoco]')")


def cli(*args: str, pre: str = "") -> subprocess.CompletedProcess:
    """python -m fastsac.tools.export ARGS (pre: Python run first in that process, e.g. to hide a module)."""
    code = f"{pre}\nimport sys\nfrom fastsac.tools.export import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)


def clis(*calls: list[str]) -> list[subprocess.CompletedProcess]:
    """cli() of each call, all in one process (support/cli_batch.py): one torch import for many refusals."""
    return run_mains("fastsac.tools.export", list(calls))


def observations(task: str, n: int = 16, steps: int = 5) -> np.ndarray:
    """Real observations: resets and a few random-action steps of n envs."""
    env = make_env(task, n, seed=123)
    try:
        obs, _ = env.reset(123)
        rng = np.random.default_rng(0)
        seen = [obs]
        for _ in range(steps):
            obs = env.step(rng.uniform(env.action_low, env.action_high, (n, env.act_dim)).astype(np.float32)).obs
            seen.append(obs)
        return np.concatenate(seen).astype(np.float32)
    finally:
        env.close()


def trainer_actions(agent, obs: np.ndarray) -> np.ndarray:
    return agent.act(torch.from_numpy(obs), deterministic=True).numpy()


@pytest.fixture(params=TASKS)
def trained(request, tmp_path):
    needs(request.param)
    path, agent = make_checkpoint(tmp_path, request.param)
    obs = observations(request.param)
    return path, agent, obs, trainer_actions(agent, obs)


@pytest.mark.process
def test_torchscript_actor_gives_the_trainers_deterministic_actions(trained, tmp_path):
    path, agent, obs, want = trained
    out = tmp_path / "actor.pt"
    proc = cli(str(path), "--format", "torchscript", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    actor = torch.jit.load(str(out))
    for rows in (obs, obs[:1], obs[:7]):                  # batch size is not baked in
        got = actor(torch.from_numpy(rows)).numpy()
        np.testing.assert_allclose(got, trainer_actions(agent, rows), atol=ATOL, rtol=0)
    np.testing.assert_allclose(actor(torch.from_numpy(obs)).numpy(), want, atol=ATOL, rtol=0)
    assert np.abs(want).max() > 0 and not np.allclose(want, want[0])   # the check is not vacuous


@pytest.mark.process
def test_onnx_actor_gives_the_trainers_deterministic_actions(trained, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'fastsac[export]')")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (pip install 'fastsac[export]')")
    path, agent, obs, want = trained
    out = tmp_path / "actor.onnx"
    proc = cli(str(path), "--format", "onnx", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    [inp], [outp] = session.get_inputs(), session.get_outputs()
    assert (inp.name, outp.name) == ("obs", "action") and not isinstance(inp.shape[0], int)  # dynamic batch
    for rows in (obs, obs[:1], obs[:7]):
        [got] = session.run(["action"], {"obs": rows})
        np.testing.assert_allclose(got, trainer_actions(agent, rows), atol=ATOL, rtol=0)
    [got] = session.run(["action"], {"obs": obs})
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.process
def test_the_exported_file_says_what_it_is(tmp_path):
    import json
    path, agent = make_checkpoint(tmp_path, "pendulum")
    out = tmp_path / "actor.pt"
    assert cli(str(tmp_path / "run"), "--format", "torchscript", str(out)).returncode == 0   # a run_dir works too
    extra = {"fastsac.json": ""}
    torch.jit.load(str(out), _extra_files=extra)
    meta = json.loads(extra["fastsac.json"])
    assert meta["env"] == "pendulum" and (meta["obs_dim"], meta["act_dim"]) == (3, 1)
    assert meta["action_low"] == [-2.0] and meta["action_high"] == [2.0] and meta["checkpoint"]["env_steps"] == 64


@pytest.mark.process
def test_missing_or_corrupt_checkpoint_is_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "actor.pt"
    path, _ = make_checkpoint(tmp_path, "pendulum")
    bad = tmp_path / "bad.pt"
    shutil.copyfile(path, bad)
    flip_tensor_bytes(bad)
    missing, corrupt, no_dir, tflite = clis([str(tmp_path / "nope.pt"), "--format", "torchscript", str(out)],
                                            [str(bad), "--format", "torchscript", str(out)],
                                            [str(path), "--format", "torchscript", str(tmp_path / "no_dir" / "a.pt")],
                                            [str(path), "--format", "tflite", str(out)])
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "nope.pt" in missing.stderr, \
        missing.stderr
    assert corrupt.returncode == 2 and "corrupt" in corrupt.stderr and "bad.pt" in corrupt.stderr, corrupt.stderr
    assert no_dir.returncode == 2 and "no_dir" in no_dir.stderr, no_dir.stderr
    assert tflite.returncode == 2 and "tflite" in tflite.stderr, tflite.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt", "run"]


@pytest.mark.process
def test_onnx_without_its_extra_is_exit_2_with_the_pip_command(tmp_path):
    path, _ = make_checkpoint(tmp_path, "pendulum")
    out = tmp_path / "actor.onnx"
    proc = cli(str(path), "--format", "onnx", str(out), pre="import sys; sys.modules['onnxruntime'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "onnxruntime" in proc.stderr and "pip install 'fastsac[export]'" in proc.stderr, proc.stderr
    assert not out.exists()


def limited_file_size(limit: int):
    """preexec_fn: files of this process may not grow past `limit` bytes, as on a full disk (a
    write past it fails with EFBIG; SIGXFSZ, which would kill the process, is ignored)."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.process
def test_export_never_writes_over_a_checkpoint_or_into_checkpoints(tmp_path):
    path, _ = make_checkpoint(tmp_path, "pendulum")
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    link = tmp_path / "link.pt"
    link.symlink_to(path)
    other = tmp_path / "copy_of_a_checkpoint.pt"
    shutil.copyfile(path, other)
    cases = [(str(path), str(path), "is the checkpoint this command reads"),           # the case
             (str(run), str(path), "is the checkpoint this command reads"),            # run_dir -> that file
             (str(path), str(link), "is the checkpoint this command reads"),           # through a symlink
             (str(path), str(path.parent / "actor.pt"), "inside a run's checkpoints/"),
             (str(path), str(other), "is a fastsac checkpoint")]
    for (source, out, why), proc in zip(cases, clis(*([s, "--format", "torchscript", o] for s, o, _ in cases))):
        assert proc.returncode == 2, (source, out, proc.stdout + proc.stderr)
        assert why in proc.stderr and "Traceback" not in proc.stderr, (source, out, proc.stderr)
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before
    assert other.read_bytes() == before[path.name]
    # a folder of the user's that happens to be called checkpoints is no run's
    mine = tmp_path / "mine" / "checkpoints"
    mine.mkdir(parents=True)
    proc = cli(str(path), "--format", "torchscript", str(mine / "actor.pt"))
    assert proc.returncode == 0 and (mine / "actor.pt").is_file(), proc.stderr


@pytest.mark.process
def test_export_never_writes_a_runs_own_files_nor_an_existing_file_without_force(tmp_path):
    """`fastsac-export RUN --format torchscript RUN/metrics.jsonl` replaced the run's metrics with a
    zip: OUT must carry its format's extension, be none of a run's own files, and an existing
    OUT is replaced only with --force (without torch.load's warnings about a file that is no
    checkpoint); a symbolic link loop is named."""
    path, _ = make_checkpoint(tmp_path, "pendulum")
    run = tmp_path / "run"
    for own in ("metrics.jsonl", "tb/events.out.tfevents.1.host", "logs/learner.log", ".fastsac.lock"):
        (run / own).parent.mkdir(parents=True, exist_ok=True)
        (run / own).write_text('{"env_steps": 8}\n')
    mine = tmp_path / "actor.pt"
    mine.write_text("an earlier export")
    loop = tmp_path / "loop.pt"
    loop.symlink_to(tmp_path / "loop2.pt")
    (tmp_path / "loop2.pt").symlink_to(loop)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    cases = [("torchscript", run / "metrics.jsonl", [], "does not end in .pt or .ts"),   # the case
             ("onnx", tmp_path / "a.pt", [], "does not end in .onnx"),
             ("torchscript", run / "tb" / "actor.pt", ["--force"], "files of the run in"),
             ("torchscript", run / "logs" / "learner.pt", ["--force"], "files of the run in"),
             ("torchscript", mine, [], "exists; give --force"),
             ("torchscript", loop, [], "symbolic link loop")]
    refusals = clis(*([str(run), "--format", f, str(o), *e] for f, o, e, _ in cases))
    for (fmt, out, extra, why), proc in zip(cases, refusals):
        assert proc.returncode == 2, (out, proc.stdout + proc.stderr)
        assert why in proc.stderr and str(out) in proc.stderr and "Traceback" not in proc.stderr, (out, proc.stderr)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # --force replaces a file of the user's, a run_dir takes new files, and replacing an earlier
    # export (a TorchScript archive) makes torch.load say nothing
    for out in (mine, run / "actor.ts", run / "actor.ts"):
        proc = cli(str(run), "--format", "torchscript", str(out), "--force")
        assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stdout + proc.stderr
        assert torch.jit.load(str(out)) is not None


@pytest.mark.process
def test_an_output_directory_that_takes_no_file_is_exit_2(tmp_path):
    path, _ = make_checkpoint(tmp_path, "pendulum")
    proc = cli(str(path), "--format", "torchscript", "/proc/a.pt")
    assert proc.returncode == 2 and "cannot create a file next to '/proc/a.pt'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_full_disk_is_exit_1_in_one_line_and_leaves_no_file(tmp_path, fmt):
    if fmt == "onnx":
        for name in ("onnx", "onnxscript", "onnxruntime"):
            pytest.importorskip(name, reason="--format onnx needs the export extra (pip install 'fastsac[export]')")
    path, _ = make_checkpoint(tmp_path, "pendulum")
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(path), "--format", fmt, str(out / ("a.onnx" if fmt == "onnx" else "a.pt"))]
    code = f"import sys\nfrom fastsac.tools.export import main\nsys.exit(main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          preexec_fn=limited_file_size(2048), env={**__import__("os").environ,
                                                                   "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr         # before: SIGABRT (torchscript), a traceback (onnx)
    assert "fastsac-export: error: writing" in proc.stderr and "nothing was written there" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "terminate called" not in proc.stderr, proc.stderr
    assert list(out.iterdir()) == []
