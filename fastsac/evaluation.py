"""Evaluation during training (`eval.*`): deterministic episodes on envs that are not training
envs, and the result every trainer logs the same way.

Both trainers use it: the synchronous trainer inline (`InlineEvaluator`), the async job in its
own evaluator process (fastsac.evaluator_main), whose results the learner logs. The policy is
the deterministic one (tanh of the mean, scaled to the action bounds) with the observation
normalizer read-only; the caller passes it as `act(obs) -> actions`.

Episodes: `eval.episodes` split over `eval.num_envs` envs (env j plays episodes // n episodes,
the first episodes % n envs one more; never more envs than episodes), all stepped together,
every env reset with the same eval seed at each evaluation, so successive evaluations start
from the same states and differ only by the weights. The seed is `eval.seed`, or derived from
the training seed by eval_seed: never one a training env uses.

Torch-free (numpy only): the plan shows the eval seed, and the processes that evaluate bring
their own torch.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

SCALARS = ("mean_return", "mean_ep_len", "min_return", "max_return", "min_ep_len", "max_ep_len", "seconds")
STEP_CALLBACK_S = 0.1   # how often on_step runs (heartbeat, stop check) during the episodes


# The evaluator's weight snapshot holds the policy vector (FastSAC.policy_flat()'s layout) and, in
# the same seqlock-protected buffer, the env step and the learner's weight version of those weights
# as two int64 in 4 float32 slots: they always arrive together with the weights they describe.
TAG_SLOTS = 4


def snapshot_numel(policy_numel: int) -> int:
    return policy_numel + TAG_SLOTS


def pack_weights(out: np.ndarray, flat: np.ndarray, env_steps: int, weight_version: int) -> np.ndarray:
    """Fill out (float32 [snapshot_numel]) with the policy vector and its tag."""
    out[:-TAG_SLOTS] = flat
    out[-TAG_SLOTS:].view(np.int64)[:] = (env_steps, weight_version)
    return out


def unpack_tag(buf: np.ndarray) -> tuple[int, int]:
    """(env_steps, weight_version) of the weights in buf."""
    env_steps, version = buf[-TAG_SLOTS:].view(np.int64)
    return int(env_steps), int(version)


def quotas(episodes: int, num_envs: int) -> list[int]:
    """Episodes per eval env: episodes split over min(num_envs, episodes) envs, the first ones one more."""
    n = max(1, min(num_envs, episodes))
    base, extra = divmod(episodes, n)
    return [base + (1 if j < extra else 0) for j in range(n)]


_EVAL_SEED_TAG = 0x6576616C   # "eval": keys the derived seed apart from every other use of the job's seed


def eval_seed(train_seed: int, num_collectors: int) -> int:
    """A seed derived from the training seed, never one a collector of the job used (seed + i)."""
    used = {train_seed + i for i in range(max(1, num_collectors))}
    tag = _EVAL_SEED_TAG
    while True:
        seed = int(np.random.SeedSequence([train_seed, tag]).generate_state(1, np.uint32)[0])
        if seed not in used:
            return seed
        tag += 1


def resolve_seed(cfg) -> int:
    """eval.seed, or the seed derived from the training seed (none a training env uses)."""
    if cfg.eval.seed >= 0:
        return cfg.eval.seed
    return eval_seed(cfg.seed, cfg.trainer.async_options.num_collectors)


def make_eval_env(cfg, num_threads: int = 1):
    """The eval envs: the training task, min(eval.num_envs, eval.episodes) of them, eval seed."""
    from fastsac.envs.registry import make_env
    n = len(quotas(cfg.eval.episodes, cfg.eval.num_envs))
    return make_env(cfg.env.name, n, seed=resolve_seed(cfg), max_episode_steps=cfg.env.max_episode_steps,
                    num_threads=num_threads)


def run_eval_episodes(act: Callable[[np.ndarray], np.ndarray], env, seed: int, episodes: int,
                      on_step: Callable[[], bool] | None = None,
                      before_step: Callable[[np.ndarray], None] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Play `episodes` episodes split over env's envs; (returns, lengths) in env order (env 0's
    episodes first), or None when on_step (called about every STEP_CALLBACK_S) returned False (a
    stop: the evaluation is abandoned). before_step(counting), if given, runs before every step
    with the mask of the envs whose episodes are still counted (fastsac-eval --video films with it)."""
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
            before_step(done < want)
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


def summarize(returns: np.ndarray, lengths: np.ndarray, env_steps: int, weight_version: int,
              seconds: float) -> dict:
    """The result record (the eval channel's fields, fastsac.shm_layout.eval_channel)."""
    return {"env_steps": int(env_steps), "weight_version": int(weight_version), "episodes": len(returns),
            "mean_return": float(np.mean(returns)), "min_return": float(np.min(returns)),
            "max_return": float(np.max(returns)), "mean_ep_len": float(np.mean(lengths)),
            "min_ep_len": int(np.min(lengths)), "max_ep_len": int(np.max(lengths)), "seconds": float(seconds),
            "finished_ns": time.monotonic_ns()}


def scalars(result: dict) -> dict[str, float]:
    """eval/* TensorBoard scalars of a result (logged at result['env_steps'])."""
    return {f"eval/{k}": float(result[k]) for k in SCALARS}


def line(result: dict) -> str:
    """The console line of a result."""
    return (f"eval @ {result['env_steps']:,} env steps (weights v{result['weight_version']}): return mean "
            f"{result['mean_return']:.1f} min {result['min_return']:.1f} max {result['max_return']:.1f} | "
            f"length mean {result['mean_ep_len']:.1f} min {result['min_ep_len']} max {result['max_ep_len']} | "
            f"{result['episodes']} episodes in {result['seconds']:.2f}s")


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
        returns, lengths = run_eval_episodes(self.act, self.env, resolve_seed(self.cfg), self.cfg.eval.episodes)
        return summarize(returns, lengths, env_steps, weight_version, time.perf_counter() - t0)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
