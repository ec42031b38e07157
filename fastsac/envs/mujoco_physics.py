"""How a batched MuJoCo task's envs are stepped: two backends with one interface.

Both make, for every env, exactly the MuJoCo calls of Gymnasium's `MujocoEnv` (v5): write
`ctrl`, `mj_step(model, data, frame_skip)`, then `mj_rnePostConstraint` where the task reads
contact forces; a reset is `mj_resetData`, writing qpos/qvel, `mj_forward`. Results are
bit-identical between the backends and at any thread count (tested).

* `LoopPhysics`: one `MjData` per env, a Python loop over the envs (a thread pool when
  num_threads > 1; MuJoCo releases the GIL inside `mj_step`). Works for every task: after the
  step any MjData field can be read, and `mj_rnePostConstraint` can run on the stepped data.
  Its per-env Python holds the GIL (~8 µs per env-step), which limits how many threads help.
* `BatchPhysics`: MuJoCo 4's `mujoco.batch.Batch`, which steps all envs in C on its own
  thread pool without the GIL. It keeps each env's state as a row and one `MjData` per
  thread, so only state fields (qpos, qvel, ...) are meaningful after a step and nothing can
  run between `mj_step` and the copy-out: it serves tasks that read state fields only and
  need no `mj_rnePostConstraint` (HalfCheetah). Measured on 2 cores for HalfCheetah: 1.2x
  the loop with one thread, 2.0-2.2x the loop with two (docs/performance.md).

Each backend exposes `f` (field name -> float64 [N, ...] array, current after `step` and
`reset`) and `step(ctrl)`, `reset(idx, qpos, qvel)`, `get_state(i)`, `close()`.
"""
from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np


class LoopPhysics:
    """One MjData per env, stepped by a Python loop (on a thread pool when num_threads > 1)."""

    def __init__(self, mj, model, num_envs: int, frame_skip: int, rne_post_constraint: bool,
                 fields: dict[str, Callable[[Any], np.ndarray]], num_threads: int, thread_name: str):
        self._mj, self.model, self.num_envs, self.frame_skip = mj, model, num_envs, frame_skip
        self._rne_post = rne_post_constraint
        self._datas = [mj.MjData(model) for _ in range(num_envs)]
        self._ctrl_views = [d.ctrl for d in self._datas]
        self._ctrl: np.ndarray | None = None  # the controls of the step in progress (read by every thread)
        # per field: (batch buffer, list of per-env views into each MjData)
        self.f: dict[str, np.ndarray] = {}
        self._gather: list[tuple[np.ndarray, list[np.ndarray]]] = []
        for name, get in fields.items():
            views = [get(d) for d in self._datas]
            buf = np.zeros((num_envs, *views[0].shape), np.float64)
            self.f[name] = buf
            self._gather.append((buf, views))
        self._pool: ThreadPoolExecutor | None = None
        if num_threads > 1:
            self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix=thread_name)
            # a few chunks per thread: contact-rich envs cost more, small chunks balance the load
            n_chunks = min(num_envs, 4 * num_threads)
            bounds = np.linspace(0, num_envs, n_chunks + 1).astype(int)
            self._chunks = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))

    def _step_range(self, lo: int, hi: int) -> None:
        mj, m, fs = self._mj, self.model, self.frame_skip
        step, post = mj.mj_step, (mj.mj_rnePostConstraint if self._rne_post else None)
        datas, ctrl_views, ctrl = self._datas, self._ctrl_views, self._ctrl
        for i in range(lo, hi):
            d = datas[i]
            ctrl_views[i][:] = ctrl[i]
            step(m, d, fs)
            if post is not None:
                post(m, d)
        for buf, views in self._gather:
            buf[lo:hi] = views[lo:hi]

    def step(self, ctrl: np.ndarray) -> None:
        self._ctrl = ctrl
        if self._pool is None:
            self._step_range(0, self.num_envs)
        else:
            for fut in [self._pool.submit(self._step_range, lo, hi) for lo, hi in self._chunks]:
                fut.result()

    def reset(self, idx: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        mj, m = self._mj, self.model
        for i, q, v in zip(idx, qpos, qvel):
            d = self._datas[i]
            mj.mj_resetData(m, d)
            d.qpos[:] = q
            d.qvel[:] = v
            mj.mj_forward(m, d)
        for buf, views in self._gather:
            buf[idx] = [views[i] for i in idx]

    def get_state(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        d = self._datas[i]
        return d.qpos.copy(), d.qvel.copy()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class BatchPhysics:
    """All envs as state rows of one `mujoco.batch.Batch`, stepped in C on num_threads threads.

    `f[name]` are the Batch's live (N, ...) views of the state rows, so they are current after
    every call without a copy.
    """

    def __init__(self, mj, batch_module, model, num_envs: int, frame_skip: int, field_names, num_threads: int):
        self.frame_skip = frame_skip
        self._no_stage = int(mj.mjtStage.mjSTAGE_NONE)
        self._batch = batch_module.Batch(model, num_envs, nthread=num_threads)
        self._ctrl = self._batch.bind("ctrl")
        self.f = {name: self._batch.bind(name) for name in field_names}
        self._qpos, self._qvel = self._batch.bind("qpos"), self._batch.bind("qvel")

    def step(self, ctrl: np.ndarray) -> None:
        self._ctrl[:] = ctrl
        self._batch.step(nstep=self.frame_skip)

    def reset(self, idx: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> None:
        # mj_resetData on the rows (no forward: the state is written next), the new state, then
        # mj_forward as Gymnasium does (it changes no state field, but keeps the calls the same)
        self._batch.reset(idx, stage=self._no_stage)
        self._qpos[idx] = qpos
        self._qvel[idx] = qvel
        self._batch.forward(idx)

    def get_state(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._qpos[i].copy(), self._qvel[i].copy()

    def close(self) -> None:
        self._batch = None


def mujoco_batch_module():
    """mujoco.batch (MuJoCo >= 4.0), or None on an older MuJoCo."""
    try:
        return importlib.import_module("mujoco.batch")
    except ImportError:
        return None
