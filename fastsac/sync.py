"""The synchronous baseline (`trainer.asynchronous: false`): one process, one loop.

    act -> env.step -> buffer.extend -> update(num_updates)    (repeat num_iterations times)

It is the reference the async trainer is measured against, and the simplest way to
debug the algorithm. Checkpoints are interchangeable with the async learner's.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from fastsac.common.episodes import EpisodeTracker
from fastsac.common.seeds import learner_torch_seed, reset_seed, sync_action_seed
from fastsac.common.stopping import StopSignal
from fastsac.config import Config
from fastsac.envs.registry import EnvSpec, make_env
from fastsac.envs.stepping import act_and_step
from fastsac.evaluation.episodes import InlineEvaluator
from fastsac.process.torch_runtime import configure_torch, open_device
from fastsac.training import state as run_state
from fastsac.training.schedule import RunSchedule
from fastsac.training.telemetry import Telemetry
from fastsac.training.thread_tuner import ThreadTuner


def train_sync(cfg: Config) -> int:
    run_state.check_run_dir_lineage(cfg.run_path, cfg.resume)  # one run per run_dir: before anything is created
    # SIGTERM/SIGINT/SIGHUP (stopping.STOP_SIGNALS, as the async launcher): finish the iteration, final
    # checkpoint, exit 0. Installed before torch and the envs run, so a stop while they build (C++
    # that calls Python) is recorded, never raised
    stop = StopSignal().install()
    configure_torch()   # the threads stay: stepping and learning alternate on every CPU we may use
    # the device made current before any other CUDA call, TF32 as configured (algo.tf32), and named
    device = open_device(cfg.device, tf32=cfg.algo.tf32, log=lambda m: print(f"fastsac sync: {m}", flush=True))
    torch.manual_seed(learner_torch_seed(cfg.seed))
    n = cfg.env.num_envs
    # stepping and learning alternate in this process: physics may use every CPU it can run on
    # (results do not depend on the number of physics threads)
    env = make_env(cfg.env.name, n, seed=cfg.seed, first_env_id=0, max_episode_steps=cfg.env.max_episode_steps,
                   num_threads=len(os.sched_getaffinity(0)))
    spec = EnvSpec(env.obs_dim, env.critic_obs_dim, env.act_dim, env.max_episode_steps)
    agent, buffer = run_state.build_agent(cfg, spec, env.action_low, env.action_high, device)
    env_steps = run_state.restore(cfg, spec, agent)
    schedule = RunSchedule(cfg.checkpoint.interval, n, cfg.trainer.num_iterations * n, env_steps)
    if done := schedule.nothing_left(env_steps):   # a finished run resumed: no copy of its final checkpoint
        print(f"fastsac sync: {done}", flush=True)
        env.close()
        return 0
    start_it = env_steps // n
    obs, critic_obs = env.reset(reset_seed(cfg.seed, start_env_steps=env_steps))
    rng = np.random.default_rng(sync_action_seed(cfg.seed, start_it))
    cfg.run_path.mkdir(parents=True, exist_ok=True)
    telemetry = Telemetry(cfg, env_steps, agent.num_updates_done, cfg.trainer.num_iterations * n,
                          episode_steps=spec.max_episode_steps, lineage=run_state.lineage(cfg))
    log = telemetry.metrics
    # on the CPU the update's thread count is measured, not assumed (fastsac.training.thread_tuner)
    threads = ThreadTuner(torch.get_num_threads(), agent.set_threads, log=log.line) \
        if device.type == "cpu" and torch.get_num_threads() > 1 else None
    episodes = EpisodeTracker(n)
    # eval.*: deterministic episodes on separate envs, inline (the sync trainer has no other process)
    evaluator = InlineEvaluator(cfg, lambda o: agent.act(torch.as_tensor(o).to(device), deterministic=True).cpu()
                                .numpy(), env_steps)
    rows = slice(0, n)
    def policy(o: np.ndarray) -> np.ndarray:   # the agent's stochastic actions, numpy in and out
        return agent.act(torch.as_tensor(o).to(device)).cpu().numpy()

    stepping = env.describe_stepping()
    log.line(f"fastsac sync: {cfg.env.name} x{n} envs{f' ({stepping})' if stepping else ''} on {device}, "
             f"iterations {start_it}..{cfg.trainer.num_iterations}")
    it = start_it
    for it in range(start_it, cfg.trainer.num_iterations):
        if stop.requested:
            log.line("stop requested: writing final checkpoint")
            break
        res, batch = act_and_step(env, obs, critic_obs, rng, None if it < cfg.algo.learning_starts else policy)
        run_state.ingest(agent, buffer, rows, batch.compact().map(lambda name, x: torch.as_tensor(x).to(device)))
        episodes.step(res.reward, res.terminated | res.truncated)
        obs, critic_obs = res.obs, res.critic_obs
        env_steps += n
        if it >= cfg.algo.learning_starts and cfg.algo.num_updates > 0 and buffer.ready():
            t0 = time.perf_counter()
            telemetry.last_train = agent.train(buffer, cfg.algo.num_updates)
            spent = time.perf_counter() - t0
            telemetry.learn_time += spent
            if threads is not None:
                threads.record(spent, cfg.algo.num_updates)
        with torch.no_grad():
            result = evaluator.maybe_run(env_steps, agent.num_updates_done)
        if result is not None:
            telemetry.log_eval(result)
        if telemetry.due(env_steps) and not schedule.finished(env_steps):   # finish() logs the last
            telemetry.log(env_steps, agent.num_updates_done, episodes.totals())
        if schedule.checkpoint_due(env_steps):
            try:
                run_state.save(cfg, spec, agent, env_steps)
            except run_state.CheckpointSaveError as exc:  # disk full, I/O error: keep training
                print(f"fastsac sync: error: {exc}; training goes on, next try at iteration "
                      f"{schedule.next_checkpoint_it:,}", file=sys.stderr, flush=True)
    try:
        return finish(cfg, spec, agent, env_steps, telemetry, episodes)
    finally:
        evaluator.close()
        env.close()


def finish(cfg: Config, spec: EnvSpec, agent, env_steps: int, telemetry: Telemetry, episodes: EpisodeTracker) -> int:
    """Every run logs its final metrics (however short it was or however it stopped), writes its
    final checkpoint and sums up; the exit code (1: the final checkpoint failed)."""
    if telemetry.has_news(env_steps, agent.num_updates_done):
        telemetry.log(env_steps, agent.num_updates_done, episodes.totals())
    exit_code, path = 0, None
    try:
        path = run_state.save(cfg, spec, agent, env_steps)
        telemetry.metrics.line(f"final checkpoint: {path}")
    except run_state.CheckpointSaveError as exc:  # the run did not end whole: exit 1 with the reason
        print(f"fastsac sync: error: the final checkpoint failed: {exc}", file=sys.stderr, flush=True)
        exit_code = 1
    telemetry.summary(env_steps, agent.num_updates_done, path)
    telemetry.close()
    return exit_code
