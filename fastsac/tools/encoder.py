"""H.264 mp4 encoding for `fastsac-eval --video`: RGB frames piped into the ffmpeg binary that the
imageio-ffmpeg wheel ships (extra fastsac[video]; no system ffmpeg).

The pipe is ours, not a library writer's, because the verdict must be: imageio's writer ignores
ffmpeg's exit status, so on a full disk it "succeeds" with a truncated file. Here `close()`
raises OSError carrying ffmpeg's own last message ("No space left on device") when ffmpeg
exits non-zero or wrote nothing, and the caller keeps the file out of place.
"""
from __future__ import annotations

import collections
import importlib
import signal
import subprocess
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np

from fastsac.errors import ConfigError

VIDEO_EXTRA_HINT = "pip install 'fastsac[video]'"
ENCODER_MODULE = "imageio_ffmpeg"
# libx264's constant rate factor (0 = lossless, 51 = worst): 15 keeps a 1000-frame 640x480
# episode at a few MB
H264_CRF = 15
STDERR_LINES_KEPT = 20


def ffmpeg_exe() -> str:
    """The ffmpeg binary of imageio-ffmpeg; ConfigError naming the extra when it is missing."""
    try:
        module = importlib.import_module(ENCODER_MODULE)
    except ImportError:
        raise ConfigError(f"--video needs imageio-ffmpeg (it ships the ffmpeg binary); missing: imageio-ffmpeg. "
                          f"Install it with: {VIDEO_EXTRA_HINT}") from None
    try:
        return module.get_ffmpeg_exe()
    except RuntimeError as exc:
        raise ConfigError(f"--video: imageio-ffmpeg finds no ffmpeg binary ({exc}); reinstall it: "
                          f"{VIDEO_EXTRA_HINT}") from None


class H264Writer:
    """Frames [height, width, 3] uint8 in, an mp4 at `path` out."""

    def __init__(self, path: Path, width: int, height: int, fps: float):
        self.path, self.shape = path, (height, width, 3)
        cmd = [ffmpeg_exe(), "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}",
               "-r", str(Fraction(fps).limit_denominator()), "-i", "-", "-an", "-vcodec", "libx264",
               "-pix_fmt", "yuv420p", "-crf", str(H264_CRF),
               "-movflags", "+faststart",      # playable while it downloads
               "-f", "mp4", str(path)]
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # drained all along: a chatty failing ffmpeg must never block on a full stderr pipe
        self._drain = threading.Thread(target=self._read_stderr, name="ffmpeg-stderr", daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            if line.strip():
                self._stderr.append(line.decode(errors="replace").strip())

    def _verdict(self, rc: int) -> str:
        """How ffmpeg ended, with its own last message (e.g. 'No space left on device')."""
        self._drain.join(timeout=5.0)
        said = f": {self._stderr[-1]}" if self._stderr else ""
        if rc < 0:
            return f"the encoder (ffmpeg) was killed by {signal.Signals(-rc).name} ({signal.strsignal(-rc)}){said}"
        return f"the encoder (ffmpeg) failed with exit code {rc}{said}"

    def write(self, frame: np.ndarray) -> None:
        if frame.shape != self.shape or frame.dtype != np.uint8:
            raise ValueError(f"a video frame must be {self.shape} uint8, got {frame.shape} {frame.dtype}")
        try:
            self.proc.stdin.write(np.ascontiguousarray(frame).data)
        except (BrokenPipeError, OSError):
            raise OSError(self._verdict(self.proc.wait())) from None

    def close(self) -> None:
        """Flush and wait for ffmpeg; OSError unless it exited 0 and wrote a non-empty file."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass                       # it already died: its exit status says why
        rc = self.proc.wait()
        if rc != 0:
            raise OSError(self._verdict(rc))
        if not self.path.is_file() or self.path.stat().st_size == 0:
            raise OSError(f"the encoder (ffmpeg) exited 0 but wrote nothing to {str(self.path)!r}")

    def abort(self) -> None:
        """Stop ffmpeg without a verdict (an unfinished video is thrown away)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
