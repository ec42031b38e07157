"""`fastsac-eval --video OUT.mp4`: one evaluation episode as an H.264 mp4.

What is filmed: env 0 of the evaluation (the first episode), one frame per step of its counted
episode, showing the state each action was chosen in, so the video has as many frames as that
episode has steps; it plays in real time (fps = 1 / the env's control timestep).

Frames:
* MuJoCo tasks (every `MujocoVecEnv`): MuJoCo's own offscreen renderer (`mujoco.Renderer`). The
  env's state (qpos, qvel) is copied into a render-only `MjData` and `mj_forward` computes the
  poses, so either physics backend (per-env MjData loop or `mujoco.batch`, which has no MjData
  per env) renders the same way. Camera: the model's tracking camera (Gymnasium's models have
  one named "track"; else the first camera with a track/trackcom mode), else a free camera that
  follows the torso.
* The pendulum: drawn in numpy (a pole on its axle), no OpenGL.
* Anything else (gymnasium:, envpool:, custom classes): not renderable, exit 2.

Headless OpenGL: MuJoCo binds its GL backend from MUJOCO_GL when it is imported, and PyOpenGL
binds its platform once, so a backend cannot be swapped inside a process. `select_gl` therefore
tries each backend in a short child process (a tiny model rendered once) before this process
imports mujoco, and sets MUJOCO_GL to the first that works: EGL, then OSMesa. A MUJOCO_GL the
user set is the only one tried. The Debian packages each backend needs are listed here once
(scripts/setup_system.sh installs them as root).

Encoding: fastsac.tools.encoder, a pipe into the ffmpeg binary of imageio-ffmpeg (extra
fastsac[video]). Frames are streamed to ffmpeg (never all in memory) into a hidden temp file next
to OUT, which is renamed into place only when the episode is complete and ffmpeg said it wrote
the file: a failed run (a full disk included) leaves nothing at OUT. OUT is checked by
fastsac.tools.outputs (never a checkpoint; its directory must take a file).
"""
from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastsac.envs.pendulum import DT, PendulumSwingUp
from fastsac.errors import ConfigError
from fastsac.tools import outputs
from fastsac.tools.encoder import H264Writer, ffmpeg_exe

VIDEO_WIDTH, VIDEO_HEIGHT = 640, 480   # MuJoCo's default offscreen buffer size; multiples of 16 for H.264
VIDEO_SUFFIX = ".mp4"
RECORDED_ENV = 0          # the env whose (first) episode is filmed
PROGRESS_S = 5.0          # a progress line on stderr this often while filming
GL_PROBE_TIMEOUT_S = 60


@dataclass(frozen=True)
class GLBackend:
    label: str
    library: str               # what ctypes.util.find_library must find for this backend
    packages: tuple[str, ...]  # the Debian packages it needs (apt-get install --no-install-recommends)


# MUJOCO_GL value -> backend, in the order they are tried. EGL: the glvnd loader (libegl1, which
# pulls Mesa's EGL), the GL entry points PyOpenGL loads (libopengl0) and Mesa's DRI drivers, whose
# software rasterizer renders on a machine without a GPU (EGL finds no device without it). OSMesa:
# one library, Mesa's software renderer.
MESA_DRIVERS = "libgl1-mesa-dri"
GL_BACKENDS: dict[str, GLBackend] = {
    "egl": GLBackend("EGL", "EGL", ("libegl1", "libopengl0", MESA_DRIVERS)),
    "osmesa": GLBackend("OSMesa", "OSMesa", ("libosmesa6",)),
}


def system_packages() -> list[str]:
    """Every Debian package a headless render backend needs (scripts/setup_system.sh)."""
    return [p for b in GL_BACKENDS.values() for p in b.packages]


def apt_command() -> str:
    return f"apt-get install -y --no-install-recommends {' '.join(system_packages())}"


# ------------------------------------------------------------------ checks before anything runs

def check_output(arg: str) -> Path:
    """OUT must be a .mp4 file name in an existing directory that takes a new file; an existing
    file is replaced (never a checkpoint)."""
    out = Path(arg)
    if out.suffix.lower() != VIDEO_SUFFIX:
        raise ConfigError(f"--video: {arg!r} does not end in {VIDEO_SUFFIX}; the video is an mp4 file, e.g. out.mp4")
    return outputs.check_output("--video", out)


def check_encoder() -> None:
    """ConfigError naming the extra unless imageio-ffmpeg (with its ffmpeg) is installed."""
    ffmpeg_exe()


# ------------------------------------------------------------------ headless OpenGL

_PROBE = """
import mujoco
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><light pos="0 0 1"/>'
                                   '<geom type="sphere" size="0.1"/></worldbody></mujoco>')
r = mujoco.Renderer(m, 32, 32)
try:
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    r.update_scene(d)
    image = r.render()
finally:
    r.close()
assert image.any(), "it renders an all-black image"
"""


@dataclass
class GLChoice:
    """The MUJOCO_GL this process renders with (None: none works) and why the others did not."""
    backend: str | None
    failures: dict[str, str] = field(default_factory=dict)

    def require(self, env_name: str) -> None:
        if self.backend is not None:
            return
        why = "; ".join(f"{GL_BACKENDS[b].label if b in GL_BACKENDS else b} (MUJOCO_GL={b}): {reason}"
                        for b, reason in self.failures.items())
        raise ConfigError(f"--video: {env_name!r} is rendered with MuJoCo's offscreen OpenGL renderer and no "
                          f"headless backend works here: {why}. Install the libraries as root: {apt_command()} "
                          f"(scripts/bootstrap.sh does this when run as root with the video extra)")

    def describe(self) -> str:
        if self.backend is None:
            return "no OpenGL"
        label = GL_BACKENDS[self.backend].label if self.backend in GL_BACKENDS else self.backend
        tried = "".join(f"; {b} failed: {reason}" for b, reason in self.failures.items())
        return f"MUJOCO_GL={self.backend} ({label}{tried})"


def _probe(backend: str) -> str | None:
    """None when MuJoCo renders with this backend in a fresh process, else why not (one line)."""
    spec = GL_BACKENDS.get(backend)
    if spec is not None and ctypes.util.find_library(spec.library) is None:
        return f"lib{spec.library} not found (apt-get install -y --no-install-recommends {' '.join(spec.packages)})"
    env = {**os.environ, "MUJOCO_GL": backend}
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                              timeout=GL_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"rendering a test image did not finish within {GL_PROBE_TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    reason = lines[-1] if lines else f"the test render exited with {proc.returncode}"
    if backend == "egl" and "EGL device display" in reason:
        reason += f" (without a GPU driver, EGL needs Mesa's software renderer: {MESA_DRIVERS})"
    return reason[:400]


def choose_gl() -> GLChoice:
    """The first headless backend MuJoCo renders with in a fresh process (a MUJOCO_GL already set
    is the only candidate; else EGL, then OSMesa), and why the ones before it failed."""
    preset = os.environ.get("MUJOCO_GL", "").strip().lower()
    failures: dict[str, str] = {}
    for backend in [preset] if preset else list(GL_BACKENDS):
        reason = _probe(backend)
        if reason is None:
            return GLChoice(backend, failures)
        failures[backend] = reason
    return GLChoice(None, failures)


def select_gl() -> GLChoice:
    """choose_gl, and MUJOCO_GL set to its choice; call before this process imports mujoco.
    Where mujoco is already imported its backend is fixed: it is kept, and a failure shows when
    the renderer is made."""
    if "mujoco" in sys.modules:
        return GLChoice(os.environ.get("MUJOCO_GL", "").strip().lower() or "default")
    choice = choose_gl()
    if choice.backend is not None:
        os.environ["MUJOCO_GL"] = choice.backend
    return choice


def prepare() -> GLChoice:
    """Everything --video needs before the checkpoint is loaded: the encoder, then the GL backend."""
    check_encoder()
    return select_gl()


# ------------------------------------------------------------------ frame sources

class MujocoFrames:
    """Frames of one env of a MujocoVecEnv, rendered by mujoco.Renderer from its (qpos, qvel)."""

    def __init__(self, env, gl: GLChoice, width: int = VIDEO_WIDTH, height: int = VIDEO_HEIGHT):
        import mujoco  # the optional mujoco extra
        self._mj, self._env, self._gl = mujoco, env, gl
        model = env.model
        self.fps = 1.0 / env.dt
        self._data = mujoco.MjData(model)
        try:
            self._renderer = mujoco.Renderer(model, height, width)
        except Exception as exc:   # the GL backend's own errors (ImportError, GLError, RuntimeError, ...)
            raise ConfigError(f"--video: MuJoCo's offscreen renderer cannot start "
                              f"(MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}): {type(exc).__name__}: {exc}. "
                              f"The libraries it needs: {apt_command()}") from None
        self.camera = self._camera(mujoco, model)

    def describe(self) -> str:
        cam = (f"camera {self._env.model.camera(self.camera).name or self.camera!r}" if isinstance(self.camera, int)
               else "free camera following the torso")
        return f"mujoco.Renderer with {self._gl.describe()}, {cam}"

    @staticmethod
    def _camera(mujoco, model):
        """The model's tracking camera (by id), else a free camera following the torso (body 1)."""
        track_modes = {int(mujoco.mjtCamLight.mjCAMLIGHT_TRACK), int(mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM)}
        cams = range(model.ncam)
        named = [i for i in cams if model.camera(i).name == "track"]
        tracking = named or [i for i in cams if int(model.cam_mode[i]) in track_modes]
        if tracking:
            return tracking[0]
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        cam.trackbodyid = 1 if model.nbody > 1 else 0
        cam.distance = 3.0 * float(model.stat.extent)
        cam.elevation, cam.azimuth = -20.0, 90.0   # from the side, slightly above
        return cam

    def frame(self, i: int) -> np.ndarray:
        mj, d = self._mj, self._data
        d.qpos[:], d.qvel[:] = self._env.get_state(i)
        mj.mj_forward(self._env.model, d)
        self._renderer.update_scene(d, camera=self.camera)
        return self._renderer.render()

    def close(self) -> None:
        # explicitly: the renderer's __del__ at interpreter exit fails inside PyOpenGL (OSMesa)
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class PendulumFrames:
    """The pendulum drawn in numpy: a red pole (theta = 0 is upright) on a black axle, light background."""

    BACKGROUND, POLE, AXLE = (255, 255, 255), (204, 77, 77), (0, 0, 0)

    def __init__(self, env, width: int = VIDEO_WIDTH, height: int = VIDEO_HEIGHT):
        self._env = env
        self.fps = 1.0 / DT
        s = min(width, height)
        self._cx, self._cy, self._length = width / 2.0, height / 2.0, 0.4 * s
        self._pole_radius, self._axle_radius = 0.04 * s, 0.02 * s
        ys, xs = np.mgrid[0:height, 0:width]
        self._x, self._y = xs + 0.5 - self._cx, ys + 0.5 - self._cy   # pixel centres relative to the axle

    def frame(self, i: int) -> np.ndarray:
        th = float(self._env.theta[i])
        tip = np.array([np.sin(th), -np.cos(th)]) * self._length   # image y points down
        # distance of every pixel to the segment axle -> tip
        t = np.clip((self._x * tip[0] + self._y * tip[1]) / (self._length ** 2), 0.0, 1.0)
        dist = np.hypot(self._x - t * tip[0], self._y - t * tip[1])
        img = np.empty((*self._x.shape, 3), np.uint8)
        img[:] = self.BACKGROUND
        img[dist <= self._pole_radius] = self.POLE
        img[np.hypot(self._x, self._y) <= self._axle_radius] = self.AXLE
        return img

    def describe(self) -> str:
        return "drawn in numpy"

    def close(self) -> None:
        pass


def frame_source(env, env_name: str, gl: GLChoice):
    """The frame source for env's kind; ConfigError when it cannot be rendered (or no GL works)."""
    from fastsac.envs.mujoco_base import MujocoVecEnv  # it imports the optional mujoco extra
    if isinstance(env, PendulumSwingUp):
        return PendulumFrames(env)
    if isinstance(env, MujocoVecEnv):
        gl.require(env_name)
        return MujocoFrames(env, gl)
    raise ConfigError(f"--video: {env_name!r} cannot be rendered: videos are made of the built-in tasks "
                      f"(pendulum, and the MuJoCo tasks humanoid, ant, halfcheetah); run without --video")


# ------------------------------------------------------------------ recording

class VideoRecorder:
    """Streams frames of env RECORDED_ENV to an mp4 while its counted episode runs.

    `before_step` is run_eval_episodes' hook; `finish()` closes the encoder and moves the file into
    place; `close()` (always call it) removes the temp file of an unfinished video."""

    def __init__(self, source, out: Path, max_frames: int = 0):
        self.source, self.out, self.max_frames = source, out, max_frames
        self.fps = source.fps
        self.frames = 0
        self._started = self._reported = time.monotonic()
        self._tmp: Path | None = outputs.temp_path(out)
        self._writer: H264Writer | None = None
        try:
            self._writer = H264Writer(self._tmp, VIDEO_WIDTH, VIDEO_HEIGHT, self.fps)
        except OSError as exc:
            self._tmp = None
            raise ConfigError(f"--video: cannot start the encoder for {str(out)!r}: {exc}") from None

    def before_step(self, episodes_done: np.ndarray) -> None:
        if episodes_done[RECORDED_ENV] == 0:
            self._writer.write(self.source.frame(RECORDED_ENV))
            self.frames += 1
            now = time.monotonic()
            if now - self._reported >= PROGRESS_S:   # rendering 1000 MuJoCo frames takes minutes on a CPU
                self._reported = now
                most = f" of at most {self.max_frames:,}" if self.max_frames else ""
                print(f"fastsac-eval: video: {self.frames:,} frames{most} in {now - self._started:.0f}s",
                      file=sys.stderr, flush=True)

    def finish(self) -> int:
        """Close the encoder and, once it reported a whole file, rename it into place; the number
        of frames. OSError (nothing at OUT) when the encoder failed."""
        writer, self._writer = self._writer, None
        writer.close()
        os.replace(self._tmp, self.out)
        self._tmp = None
        return self.frames

    def close(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
        self.source.close()


def open_video(env, env_name: str, out: Path, gl: GLChoice) -> VideoRecorder:
    """A recorder for env's first episode into out; ConfigError (nothing created) when env cannot
    be rendered."""
    source = frame_source(env, env_name, gl)
    try:
        return VideoRecorder(source, out, env.max_episode_steps)
    except BaseException:
        source.close()
        raise
