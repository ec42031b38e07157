"""`fastsac-eval CHECKPOINT [--episodes N] [--env-name NAME] [--seed S] [--video OUT.mp4]`: how well a
trained policy does, and what it looks like.

Loads any checkpoint (the synchronous trainer and the async learner write the same format),
builds fresh envs of the trained task (or --env-name, which must have the same observation
and action sizes): one per episode up to MAX_ENVS, which then play the episodes in turn, all
stepped together, with the deterministic actor, the module that
`fastsac-export` writes (tanh of the mean, normalizer statistics frozen). Episodes end by
termination or by the env's time limit (the trained env.max_episode_steps for the trained task).
Prints mean/min/max of the episode returns and lengths. --video films the first episode (env 0)
into an mp4: MuJoCo tasks through MuJoCo's offscreen renderer (EGL or OSMesa), the pendulum drawn
in numpy (fastsac/tools/video.py; extra fastsac[video]).

Seeds: without --seed the envs are seeded with a value derived from the training seed that is
none of the seeds the job's collectors used (seed + i for collector i), so evaluation does not
replay the first training episodes. Exit codes: 0 done, 1 runtime failure (including a failed
encoder: no video is left), 2 bad input (also: an OUT that is not a .mp4 file name in an existing
writable directory, a task that cannot be rendered, no working headless OpenGL; nothing created).
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from fastsac.common.command_line import EXIT_CODES_HELP, UsageParser, quiet_broken_pipe
from fastsac.common.seeds import eval_seed
from fastsac.config import SEED_MAX
from fastsac.envs.registry import make_env
from fastsac.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError
from fastsac.evaluation.episodes import eval_env_count, run_eval_episodes
from fastsac.process.torch_runtime import configure_torch
from fastsac.run_dir.checkpoint import CheckpointError
from fastsac.tools import video
from fastsac.tools.encoder import VIDEO_EXTRA_HINT
from fastsac.tools.export import add_checkpoint_arg, load_for_env

DEFAULT_EPISODES = 10
MAX_ENVS = 64             # envs stepped together; more episodes are played in turn on them
MAX_EPISODES = 100_000    # 1e5 Humanoid episodes are 1e8 env steps: hours, already


def deterministic_actions(actor: torch.nn.Module):
    """The exported actor (raw observation in, env action out) as act(obs) -> actions, numpy."""
    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor(torch.as_tensor(obs, dtype=torch.float32)).numpy()
    return act


def build_parser():
    p = UsageParser(prog="fastsac-eval",
                    description="Run deterministic episodes of a checkpoint's policy on fresh envs and print "
                                "the mean/min/max episode return and length.",
                    epilog=EXIT_CODES_HELP)
    add_checkpoint_arg(p)
    p.add_argument("--episodes", type=int, default=DEFAULT_EPISODES,
                   help=f"episodes to play (default {DEFAULT_EPISODES}, at most {MAX_EPISODES:,}), on one env per "
                        f"episode up to {MAX_ENVS} envs stepped together")
    p.add_argument("--env-name", help="evaluate on this env instead of the trained one (same obs/action sizes)")
    p.add_argument("--seed", type=int, help="env seed (default: derived from the training seed, "
                                            "distinct from the seeds training used)")
    p.add_argument("--video", metavar="OUT.mp4",
                   help="also film the first episode into this mp4 (an existing file is replaced; needs "
                        f"{VIDEO_EXTRA_HINT}; MuJoCo tasks need EGL or OSMesa)")
    return p


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    try:
        if not 1 <= args.episodes <= MAX_EPISODES:
            raise ConfigError(f"--episodes: {args.episodes} is out of range; expected an integer from 1 to "
                              f"{MAX_EPISODES:,}")
        if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
            raise ConfigError(f"--seed: {args.seed} is out of range; expected 0..{SEED_MAX}")
        out = video.check_output(args.video) if args.video is not None else None
        gl = video.prepare() if out is not None else None   # before anything imports mujoco (load_for_env does)
        policy, env_name, max_steps = load_for_env(args.checkpoint, args.env_name)
        cfg = policy.cfg
        seed = args.seed if args.seed is not None else eval_seed(cfg.seed, cfg.trainer.async_options.num_collectors)
        env = make_env(env_name, eval_env_count(args.episodes, MAX_ENVS), seed=seed, max_episode_steps=max_steps)
        try:
            recorder = video.open_video(env, env_name, out, gl) if out is not None else None
        except BaseException:
            env.close()
            raise
    except (CheckpointError, ConfigError) as exc:
        print(f"fastsac-eval: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_torch()
    print(f"fastsac-eval: {policy.describe()}", flush=True)
    print(f"fastsac-eval: {args.episodes} deterministic episode(s) on {env.num_envs} {env_name} env(s) "
          f"(max {env.max_episode_steps} steps), "
          f"seed {seed}{'' if args.seed is not None else ' (derived from training seed ' + str(cfg.seed) + ')'}",
          flush=True)
    try:
        returns, lengths = run_eval_episodes(deterministic_actions(policy.actor), env, seed, args.episodes,
                                             before_step=recorder.before_step if recorder else None)
        frames = recorder.finish() if recorder else 0
    except (RuntimeError, OSError) as exc:   # OSError: the encoder (ffmpeg) failed, e.g. a full disk
        print(f"fastsac-eval: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        env.close()
        if recorder:
            recorder.close()
    print(f"return: mean {returns.mean():.3f}  min {returns.min():.3f}  max {returns.max():.3f}")
    print(f"length: mean {lengths.mean():.1f}  min {lengths.min()}  max {lengths.max()}")
    if recorder:
        print(f"video: {out} ({frames} frames of episode 1 at {recorder.fps:.4g} fps, {video.VIDEO_WIDTH}x"
              f"{video.VIDEO_HEIGHT}, {recorder.source.describe()})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
