"""fastsac-eval --video through its CLI on checkpoints of tiny real synchronous runs: the mp4 of a
HalfCheetah episode rendered by MuJoCo's offscreen renderer (EGL, and OSMesa as the fallback) and
of a pendulum episode drawn in numpy reads back with one frame per episode step, the right size and
frame rate, and frames that show something that moves; bad output paths, tasks that cannot be
rendered, a missing encoder or OpenGL are exit 2 with nothing created; a failure while recording
is exit 1 and leaves no file.

The MuJoCo tests need a working headless OpenGL (scripts/bootstrap.sh installs it as root with
the video extra); where there is none they skip saying why, except under CI, where they fail.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.cli_batch import run_mains
from support.e2e_helpers import launch, newest_checkpoint, tiny_config
from support.shm_jobs import new_job_name

pytest.importorskip("imageio_ffmpeg", reason="--video needs the video extra (pip install 'fastsac[video]')")
import imageio.v3 as iio  # noqa: E402  (after the skip: part of the same extra)
import imageio_ffmpeg  # noqa: E402

from fastsac.tools import video  # noqa: E402

HALFCHEETAH_STEPS = 40        # the trained env.max_episode_steps: the filmed episode's length
PENDULUM_STEPS = 50
NO_EGL = {"__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent/egl_vendor.json"}   # glvnd then finds no EGL driver


def evaluate(*args: str, env: dict | None = None, pre: str = "") -> subprocess.CompletedProcess:
    """fastsac-eval ARGS in a fresh process (pre: Python run first in it, e.g. to break something)."""
    code = f"{pre}\nimport sys\nfrom fastsac.tools.evaluate import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={**eval_env(), **(env or {})})


def eval_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}


def read_video(path: Path) -> tuple[np.ndarray, dict]:
    """(all frames [n, h, w, 3] uint8, metadata) through imageio's ffmpeg plugin."""
    return iio.imread(path), iio.immeta(path)


def train(tmp: Path, **env) -> Path:
    """The newest checkpoint of a 12-iteration synchronous run (no shared memory involved)."""
    proc = launch(tiny_config(tmp, new_job_name(), env=env, trainer={"asynchronous": False},
                              algo={"v_min": -50.0, "v_max": 50.0}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return newest_checkpoint(tmp / "run")


@pytest.fixture(scope="module")
def gl() -> video.GLChoice:
    """The headless OpenGL backend a fresh process would render with."""
    pytest.importorskip("mujoco", reason="halfcheetah needs the mujoco extra (pip install 'fastsac[mujoco]')")
    choice = video.choose_gl()
    if choice.backend is None:
        reason = f"no headless OpenGL: {choice.failures}; install: {video.apt_command()}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must render: {reason}")
        pytest.skip(reason)
    return choice


@pytest.fixture(scope="module")
def cheetah(tmp_path_factory, gl) -> Path:
    return train(tmp_path_factory.mktemp("video_cheetah"), name="halfcheetah", num_envs=4,
                 max_episode_steps=HALFCHEETAH_STEPS)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("video_pendulum"), max_episode_steps=PENDULUM_STEPS)


def assert_moving_picture(frames: np.ndarray, n: int) -> None:
    """n frames of 640x480 RGB, none blank (a black or one-colour video fails), the picture changing."""
    assert frames.shape == (n, video.VIDEO_HEIGHT, video.VIDEO_WIDTH, 3), frames.shape
    per_frame_std = frames.reshape(n, -1, 3).std(axis=1).max(axis=1)
    assert per_frame_std.min() > 10, per_frame_std.min()        # every frame has content, not one colour
    change = np.abs(np.diff(frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    assert (change > 0.05).mean() > 0.8, change                 # it moves from frame to frame


def only(directory: Path, *names: str) -> None:
    """directory holds exactly these entries (no temp file left)."""
    assert sorted(p.name for p in directory.iterdir()) == sorted(names), list(directory.iterdir())


@pytest.mark.process
def test_halfcheetah_video_reads_back_one_frame_per_step(cheetah, gl, tmp_path):
    out = tmp_path / "cheetah.mp4"
    out.write_bytes(b"an older file, replaced")
    proc = evaluate(str(cheetah), "--episodes", "2", "--video", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"length: mean {HALFCHEETAH_STEPS}.0" in proc.stdout, proc.stdout
    assert re.search(rf"video: .*cheetah\.mp4 \({HALFCHEETAH_STEPS} frames of episode 1 at 20 fps, 640x480, "
                     rf"mujoco\.Renderer with MUJOCO_GL={gl.backend} .*camera 'track'", proc.stdout), proc.stdout
    only(tmp_path, "cheetah.mp4")
    assert imageio_ffmpeg.count_frames_and_secs(str(out)) == (HALFCHEETAH_STEPS, HALFCHEETAH_STEPS / 20)
    frames, meta = read_video(out)
    assert meta["fps"] == 20 and meta["codec"] == "h264", meta       # HalfCheetah: dt = 0.01 s * 5 frames
    assert_moving_picture(frames, HALFCHEETAH_STEPS)
    # the tracking camera keeps the cheetah in view: the middle of every frame is not just floor and sky
    middle = frames[:, 160:400, 160:480].reshape(HALFCHEETAH_STEPS, -1, 3).astype(int)
    warm = (middle[..., 0] > middle[..., 2] + 30).mean(axis=1)          # the cheetah's orange/brown capsules
    assert warm.min() > 0.01, warm


@pytest.mark.process
def test_osmesa_is_the_fallback_when_egl_does_not_work(cheetah, tmp_path):
    if ctypes.util.find_library("OSMesa") is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI installs OSMesa: {video.apt_command()}")
        pytest.skip("OSMesa is not installed (Debian: libosmesa6)")
    out = tmp_path / "cheetah.mp4"
    proc = evaluate(str(cheetah), "--episodes", "1", "--video", str(out), env=NO_EGL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MUJOCO_GL=osmesa (OSMesa; egl failed: " in proc.stdout, proc.stdout
    assert_moving_picture(read_video(out)[0], HALFCHEETAH_STEPS)


@pytest.mark.process
def test_no_working_opengl_is_exit_2_naming_the_packages(cheetah, tmp_path):
    # an explicit MUJOCO_GL is the only backend tried; with no EGL driver it cannot work
    out = tmp_path / "cheetah.mp4"
    proc = evaluate(str(cheetah), "--video", str(out), env={"MUJOCO_GL": "egl", **NO_EGL})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for needed in ("no headless backend works", "EGL (MUJOCO_GL=egl)", video.apt_command(), "'halfcheetah'"):
        assert needed in proc.stderr, (needed, proc.stderr)
    only(tmp_path)


@pytest.mark.process
def test_pendulum_video_is_drawn_without_opengl(pendulum, tmp_path):
    out = tmp_path / "pendulum.MP4"
    # no OpenGL at all: the pendulum does not need it
    proc = evaluate(str(pendulum), "--episodes", "1", "--video", str(out), env={"MUJOCO_GL": "egl", **NO_EGL})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"({PENDULUM_STEPS} frames of episode 1 at 20 fps, 640x480, drawn in numpy)" in proc.stdout, proc.stdout
    only(tmp_path, "pendulum.MP4")
    frames, meta = read_video(out)
    assert meta["fps"] == 20, meta
    assert_moving_picture(frames, PENDULUM_STEPS)


BAD_OUTPUT_PATHS = [
    ("out.avi", "does not end in .mp4"),
    ("out", "does not end in .mp4"),
    ("missing/out.mp4", "does not exist"),
    ("a_dir.mp4", "is a directory"),
]


@pytest.fixture(scope="module")
def refusals(pendulum, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """{case: (fastsac-eval's answer, the folder it was given)} of the plain refusals below, all
    answered by one process (support/cli_batch.py): one torch import, not one per case; each case
    has a folder of its own."""
    cases: dict[str, tuple[list[str], Path]] = {}
    for name, _ in BAD_OUTPUT_PATHS:
        folder = tmp_path_factory.mktemp("bad_output")
        (folder / "a_dir.mp4").mkdir()
        cases[name] = ([str(pendulum), "--video", str(folder / name)], folder)
    if importlib.util.find_spec("gymnasium"):
        folder = tmp_path_factory.mktemp("not_rendered")
        cases["gymnasium"] = ([str(pendulum), "--env-name", "gymnasium:Pendulum-v1", "--video",
                               str(folder / "v.mp4")], folder)
    cases["/proc"] = ([str(pendulum), "--video", "/proc/x.mp4"], tmp_path_factory.mktemp("proc"))
    answers = run_mains("fastsac.tools.evaluate", [argv for argv, _ in cases.values()], env=eval_env())
    return {case: (proc, folder) for (case, (_, folder)), proc in zip(cases.items(), answers)}


@pytest.mark.process
@pytest.mark.parametrize("name, why", BAD_OUTPUT_PATHS)
def test_bad_output_path_is_exit_2_with_nothing_created(refusals, name, why):
    proc, tmp_path = refusals[name]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert why in proc.stderr and "--video" in proc.stderr and name in proc.stderr, proc.stderr
    only(tmp_path, "a_dir.mp4")
    assert not any((tmp_path / "a_dir.mp4").iterdir())


@pytest.mark.process
def test_a_task_that_cannot_be_rendered_is_exit_2(refusals):
    pytest.importorskip("gymnasium")
    proc, tmp_path = refusals["gymnasium"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "'gymnasium:Pendulum-v1' cannot be rendered" in proc.stderr, proc.stderr
    only(tmp_path)


@pytest.mark.process
def test_missing_encoder_is_exit_2_naming_the_extra(pendulum, tmp_path):
    proc = evaluate(str(pendulum), "--video", str(tmp_path / "v.mp4"), pre="import sys; sys.modules['imageio_ffmpeg'] = None")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "imageio-ffmpeg" in proc.stderr and "pip install 'fastsac[video]'" in proc.stderr, proc.stderr
    only(tmp_path)


@pytest.mark.process
def test_a_failure_while_recording_is_exit_1_and_leaves_no_file(pendulum, tmp_path):
    pre = """
import fastsac.tools.video as v
frame = v.PendulumFrames.frame
def failing(self, i, calls=[]):
    calls.append(i)
    if len(calls) == 10:
        raise OSError(28, "No space left on device")
    return frame(self, i)
v.PendulumFrames.frame = failing
"""
    proc = evaluate(str(pendulum), "--video", str(tmp_path / "v.mp4"), pre=pre)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "No space left on device" in proc.stderr, proc.stderr
    only(tmp_path)


@pytest.mark.process
def test_a_full_disk_while_encoding_is_exit_1_with_ffmpegs_reason_and_no_file(pendulum, tmp_path):
    """Files may not grow past 16 KiB (RLIMIT_FSIZE, as on a full disk): ffmpeg fails writing the
    mp4 (killed by SIGXFSZ: Popen restores that signal's default in its children). Before, the
    tool exited 0, printed the video line and left a truncated file at OUT."""
    import resource
    import signal

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # this Python: EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    out = tmp_path / "out"
    out.mkdir()
    argv = [str(pendulum), "--video", str(out / "v.mp4")]
    code = f"import sys\nfrom fastsac.tools.evaluate import main\nsys.exit(main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          preexec_fn=full_disk, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the encoder (ffmpeg) was killed by SIGXFSZ (File size limit exceeded)" in proc.stderr, proc.stderr
    assert "video:" not in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    only(out)


@pytest.mark.process
def test_an_output_directory_that_takes_no_file_is_exit_2(refusals):
    proc, _ = refusals["/proc"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--video: cannot create a file next to '/proc/x.mp4'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_filming_shows_progress_on_stderr(pendulum, tmp_path):
    # before: 1000 frames took 104 s with no output at all
    proc = evaluate(str(pendulum), "--episodes", "3", "--video", str(tmp_path / "v.mp4"),
                    pre="import fastsac.tools.video as v; v.PROGRESS_S = 0.0")   # a line per frame
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("fastsac-eval: video: ")]
    assert len(lines) == PENDULUM_STEPS, proc.stderr       # env 0's first episode only, not all three
    assert lines[0].startswith(f"fastsac-eval: video: 1 frames of at most {PENDULUM_STEPS} in "), lines[0]
