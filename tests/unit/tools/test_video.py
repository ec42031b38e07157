"""What fastsac-eval --video draws, in this process: the pendulum's pole along its angle, and the
camera a MuJoCo model is filmed with. The videos themselves, through the CLI:
tests/process/tools/test_video_process.py.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("imageio_ffmpeg", reason="--video needs the video extra (pip install 'fastsac[video]')")

from fastsac.tools import video  # noqa: E402


def test_pendulum_frame_points_the_pole_along_theta():
    """theta = 0 is upright: the pole's pixels are above the axle; theta = pi/2 points it right
    (Gymnasium's angle grows that way: sin(theta) is the x of the tip)."""
    class Env:
        theta = np.array([0.0, np.pi / 2])
    frames = video.PendulumFrames(Env())
    cx, cy = video.VIDEO_WIDTH / 2, video.VIDEO_HEIGHT / 2
    for i, (dx, dy) in enumerate([(0, -1), (1, 0)]):     # image y points down
        img = frames.frame(i)
        ys, xs = np.nonzero((img[..., 0] > 150) & (img[..., 1] < 120))   # the red pole
        assert len(xs) > 2000, i
        centre = np.array([xs.mean() + 0.5 - cx, ys.mean() + 0.5 - cy])
        # the pole's middle is ~0.2 * 480 px from the axle along (dx, dy), on that line
        np.testing.assert_allclose(centre, 0.2 * 480 * np.array([dx, dy]), atol=10)


def test_camera_is_the_models_tracking_camera_else_a_free_one_following_the_torso():
    mujoco = pytest.importorskip("mujoco")
    from fastsac.envs.mujoco_base import load_gymnasium_model
    for xml in ("half_cheetah.xml", "ant.xml", "humanoid.xml"):
        _, model = load_gymnasium_model(xml, xml)
        cam = video.MujocoFrames._camera(mujoco, model)
        assert model.camera(cam).name == "track", xml
    model = mujoco.MjModel.from_xml_string('<mujoco><worldbody><body name="torso"><freejoint/>'
                                           '<geom type="sphere" size="0.1"/></body></worldbody></mujoco>')
    cam = video.MujocoFrames._camera(mujoco, model)
    assert cam.type == mujoco.mjtCamera.mjCAMERA_TRACKING and cam.trackbodyid == 1
