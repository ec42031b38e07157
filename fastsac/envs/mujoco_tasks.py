"""Humanoid, Ant and HalfCheetah: Gymnasium's v5 MuJoCo locomotion tasks, batched.

Each class reproduces the default-kwargs definition of the Gymnasium v5 env of the
same name (model file, frame_skip, reset noise, observation, reward, termination,
1000-step time limit), see docs/envs.md for the list and the deviations:
  * observations are float32 (Gymnasium: float64); rewards float32;
  * actions are clipped to the action bounds before use (Gymnasium passes them
    through; MuJoCo clamps ctrl anyway, only the control cost of an out-of-range
    action differs);
  * the reset noise streams are keyed by (seed, global env id), not Gymnasium's
    per-env seed integers (same distributions, same draw order);
  * HalfCheetah skips mj_rnePostConstraint, which only computes quantities its
    observation and reward never read (so mujoco.batch can step it).
"""
from __future__ import annotations

import numpy as np

from fastsac.envs.mujoco_base import MujocoVecEnv


class Humanoid(MujocoVecEnv):
    """Gymnasium Humanoid-v5: obs 348 (qpos[2:], qvel, cinert[1:], cvel[1:], qfrc_actuator[6:], cfrc_ext[1:]), act 17."""

    env_name = "humanoid"
    xml_file = "humanoid.xml"
    frame_skip = 5
    reset_noise_scale = 1e-2
    qvel_noise = "uniform"
    forward_reward_weight = 1.25
    ctrl_cost_weight = 0.1
    contact_cost_weight = 5e-7
    contact_cost_max = 10.0
    healthy_reward = 5.0
    healthy_z_range = (1.0, 2.0)
    fields = {
        "qpos": lambda d: d.qpos,
        "qvel": lambda d: d.qvel,
        "cinert": lambda d: d.cinert[1:],
        "cvel": lambda d: d.cvel[1:],
        "qfrc_actuator": lambda d: d.qfrc_actuator[6:],
        "cfrc_ext": lambda d: d.cfrc_ext,       # all rows: the contact cost sums the world body's too
        "xipos": lambda d: d.xipos,             # for the mass center
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._body_mass = self.model.body_mass.copy()
        self._total_mass = self._body_mass.sum()

    def _observe_rows(self, idx):
        f, n = self.f, len(self.f["qpos"][idx])
        return np.concatenate([
            f["qpos"][idx, 2:], f["qvel"][idx],
            f["cinert"][idx].reshape(n, -1), f["cvel"][idx].reshape(n, -1),
            f["qfrc_actuator"][idx], f["cfrc_ext"][idx, 1:].reshape(n, -1)], axis=1)

    def _mass_center_xy(self) -> np.ndarray:
        # gymnasium.envs.mujoco.humanoid_v5.mass_center, batched
        return np.einsum("b,nbj->nj", self._body_mass, self.f["xipos"])[:, :2] / self._total_mass

    def _pre_step(self):
        return self._mass_center_xy()

    def _reward_terminated(self, pre, actions):
        x_velocity = (self._mass_center_xy()[:, 0] - pre[:, 0]) / self.dt
        z = self.f["qpos"][:, 2]
        lo, hi = self.healthy_z_range
        healthy = (lo < z) & (z < hi)
        ctrl_cost = self.ctrl_cost_weight * np.sum(np.square(actions), axis=1)
        contact_cost = np.minimum(
            self.contact_cost_weight * np.sum(np.square(self.f["cfrc_ext"]), axis=(1, 2)), self.contact_cost_max)
        reward = self.forward_reward_weight * x_velocity + self.healthy_reward * healthy - ctrl_cost - contact_cost
        return reward, ~healthy


class Ant(MujocoVecEnv):
    """Gymnasium Ant-v5: obs 105 (qpos[2:], qvel, clip(cfrc_ext[1:], -1, 1)), act 8."""

    env_name = "ant"
    xml_file = "ant.xml"
    frame_skip = 5
    reset_noise_scale = 0.1
    qvel_noise = "normal"
    forward_reward_weight = 1.0
    ctrl_cost_weight = 0.5
    contact_cost_weight = 5e-4
    contact_force_range = (-1.0, 1.0)
    healthy_reward = 1.0
    healthy_z_range = (0.2, 1.0)
    main_body = 1
    fields = {
        "qpos": lambda d: d.qpos,
        "qvel": lambda d: d.qvel,
        "cfrc_ext": lambda d: d.cfrc_ext,
        "main_xy": lambda d: d.xpos[Ant.main_body, :2],
    }

    def _contact_forces(self, idx):
        return np.clip(self.f["cfrc_ext"][idx], *self.contact_force_range)

    def _observe_rows(self, idx):
        f, n = self.f, len(self.f["qpos"][idx])
        return np.concatenate([f["qpos"][idx, 2:], f["qvel"][idx],
                               self._contact_forces(idx)[:, 1:].reshape(n, -1)], axis=1)

    def _pre_step(self):
        return self.f["main_xy"].copy()

    def _reward_terminated(self, pre, actions):
        x_velocity = (self.f["main_xy"][:, 0] - pre[:, 0]) / self.dt
        qpos, qvel = self.f["qpos"], self.f["qvel"]
        lo, hi = self.healthy_z_range
        z = qpos[:, 2]
        healthy = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1) & (lo <= z) & (z <= hi)
        ctrl_cost = self.ctrl_cost_weight * np.sum(np.square(actions), axis=1)
        contact_cost = self.contact_cost_weight * np.sum(np.square(self._contact_forces(slice(None))), axis=(1, 2))
        reward = self.forward_reward_weight * x_velocity + self.healthy_reward * healthy - ctrl_cost - contact_cost
        return reward, ~healthy


class HalfCheetah(MujocoVecEnv):
    """Gymnasium HalfCheetah-v5: obs 17 (qpos[1:], qvel), act 6, never terminates."""

    env_name = "halfcheetah"
    xml_file = "half_cheetah.xml"
    frame_skip = 5
    reset_noise_scale = 0.1
    qvel_noise = "normal"
    forward_reward_weight = 1.0
    ctrl_cost_weight = 0.1
    rne_post_constraint = False
    state_only = True   # stepped by mujoco.batch (in C, no GIL) where MuJoCo has it
    fields = {
        "qpos": lambda d: d.qpos,
        "qvel": lambda d: d.qvel,
    }

    def _observe_rows(self, idx):
        return np.concatenate([self.f["qpos"][idx, 1:], self.f["qvel"][idx]], axis=1)

    def _pre_step(self):
        return self.f["qpos"][:, 0].copy()

    def _reward_terminated(self, pre, actions):
        x_velocity = (self.f["qpos"][:, 0] - pre) / self.dt
        ctrl_cost = self.ctrl_cost_weight * np.sum(np.square(actions), axis=1)
        reward = self.forward_reward_weight * x_velocity - ctrl_cost
        return reward, np.zeros(self.num_envs, bool)
