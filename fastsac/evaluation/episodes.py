"""Evaluation episodes (`eval.*`): deterministic episodes on envs that are not training envs.

Every evaluating role uses it: the synchronous trainer inline (`InlineEvaluator`), the async
job's evaluator process (fastsac.evaluation.evaluator), fastsac-eval; the result record every
trainer logs the same way is fastsac.evaluation.result. The policy is
the deterministic one (tanh of the mean, scaled to the action bounds) with the observation
normalizer read-only; the caller passes it as `act(obs) -> actions`.

Episodes: `eval.episodes` split over `eval.num_envs` envs (env j plays episodes // n episodes,
the first episodes % n envs one more; never more envs than episodes), all stepped together,
every env reset with the same eval seed at each evaluation, so successive evaluations start
from the same states and differ only by the weights. The seed is `eval.seed`, or derived from
the training seed (fastsac.common.seeds): never one a training env uses.

Torch-free (numpy only): the processes that evaluate bring their own torch.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from fastsac.common.seeds import resolve_eval_seed
from fastsac.envs.registry import make_env
from fastsac.evaluation.result import summarize

STEP_CALLBACK_S = 0.1   # how often on_step runs (heartbeat, stop check) during the episodes


def eval_env_count(episodes: int, num_envs: int) -> int:
    """The eval envs built for `episodes` over at most `num_envs`: never more envs than episodes."""
    return max(1, min(num_envs, episodes))


def quotas(episodes: int, num_envs: int) -> list[int]:
    """Episodes per eval env: episodes split over eval_env_count envs, the first ones one more."""
    n = eval_env_count(episodes, num_envs)
    base, extra = divmod(episodes, n)
    return [base + (1 if j < extra else 0) for j in range(n)]


def make_eval_env(cfg, num_threads: int = 1):
    """The eval envs: the training task, min(eval.num_envs, eval.episodes) of them, eval seed."""
    n = eval_env_count(cfg.eval.episodes, cfg.eval.num_envs)
    return make_env(cfg.env.name, n, seed=resolve_eval_seed(cfg), max_episode_steps=cfg.env.max_episode_steps,
                    num_threads=num_threads)


def run_eval_episodes(act: Callable[[np.ndarray], np.ndarray], env, seed: int, episodes: int,
                      on_step: Callable[[], bool] | None = None,
                      before_step: Callable[[np.ndarray], None] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Play `episodes` episodes split over env's envs; (returns, lengths) in env order (env 0's
    episodes first), or None when on_step (called about every STEP_CALLBACK_S) returned False (a
    stop: the evaluation is abandoned). before_step(episodes_done), if given, runs before every step
    with the number of counted episodes each env has finished (fastsac-eval --video films env 0
    while its count is 0)."""
    want = np.array(quotas(episodes, env.num_envs), np.int64)
    if len(want) != env.num_envs:
        raise ValueError(f"{env.num_envs} eval envs for {episodes} episodes: build the env with make_eval_env")
    obs, _ = env.reset(seed)
    n = env.num_envs
    ret, length = np.zeros(n, np.float64), np.zeros(n, np.int64)
    done = np.zeros(n, np.int64)
    ended = []   # (env, return, length) of every counted episode
    # envs auto-reset: each env's episodes follow one another; a finished env's later ones are not counted
    limit = int(want.max()) * env.max_episode_steps + 1
    last_cb = time.monotonic()
    for _ in range(limit):
        if before_step is not None:
            before_step(done)
        res = env.step(act(obs))
        ret += res.reward
        length += 1
        for j in np.flatnonzero(res.terminated | res.truncated):
            if done[j] < want[j]:
                ended.append((j, ret[j], length[j]))
                done[j] += 1
            ret[j], length[j] = 0.0, 0
        if (done >= want).all():
            ended.sort(key=lambda e: e[0])   # stable: each env's episodes stay in order
            return np.array([e[1] for e in ended]), np.array([e[2] for e in ended], np.int64)
        obs = res.obs
        if on_step is not None and time.monotonic() - last_cb >= STEP_CALLBACK_S:
            last_cb = time.monotonic()
            if not on_step():
                return None
    raise RuntimeError(f"{int((want - done).sum())} of {episodes} eval episodes did not end within "
                       f"{limit} steps: the env does not truncate at its time limit ({env.max_episode_steps})")


def next_due(env_steps: int, cfg) -> int:
    """The env step of the next evaluation: the next multiple of eval.interval iterations."""
    batch = cfg.eval.interval * cfg.env.num_envs
    return (env_steps // batch + 1) * batch


class InlineEvaluator:
    """The synchronous trainer's evaluation: every eval.interval iterations, in its own loop."""

    def __init__(self, cfg, act: Callable[[np.ndarray], np.ndarray], start_env_steps: int):
        self.cfg, self.act = cfg, act
        self.enabled = cfg.eval.interval > 0
        self.env = None
        self.due_at = next_due(start_env_steps, cfg) if self.enabled else 0

    def maybe_run(self, env_steps: int, weight_version: int = 0) -> dict | None:
        """The result when an evaluation was due at env_steps, else None."""
        if not self.enabled or env_steps < self.due_at:
            return None
        self.due_at = next_due(env_steps, self.cfg)
        if self.env is None:
            self.env = make_eval_env(self.cfg)
        t0 = time.perf_counter()
        returns, lengths = run_eval_episodes(self.act, self.env, resolve_eval_seed(self.cfg), self.cfg.eval.episodes)
        return summarize(returns, lengths, env_steps, weight_version, time.perf_counter() - t0)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
