"""The peer of bench_learning.py: Stable-Baselines3 SAC on a Gymnasium task, evaluated as fastsac is.

Settings: rl-baselines3-zoo's for the MuJoCo tasks (hyperparams/sac.yml: SB3's SAC defaults,
learning_starts 10000): MlpPolicy [256, 256], batch 256, lr 3e-4, buffer 1M, tau 0.005, gamma
0.99, one gradient step per env step, entropy coefficient and target (-act_dim) tuned
automatically. One training env.

Evaluation: every --eval-every env steps, --eval-episodes deterministic episodes on separate envs
(seeded away from the training env), their time excluded from the training clock. The run stops
when the training clock reaches --budget-s (or at --max-steps) and ends with a final evaluation
of --final-episodes episodes. One CSV row per evaluation: env_steps, seconds (training clock),
wall_seconds, mean_return, min_return, max_return, kind ("periodic" or "final").

    python benchmarks/sb3_peer.py --env HalfCheetah-v5 --seed 1 --budget-s 1200 --csv sb3.csv

Needs the benchmark extra: pip install -e '.[bench,mujoco]'.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

EVAL_SEED_OFFSET = 10_000     # eval envs never share a seed with the training env
FIELDS = ("env_steps", "seconds", "wall_seconds", "mean_return", "min_return", "max_return", "kind")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=1200.0, help="training wall-clock budget")
    p.add_argument("--max-steps", type=int, default=1_000_000)
    p.add_argument("--eval-every", type=int, default=8000, help="env steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--final-episodes", type=int, default=10, help="episodes of the final evaluation")
    p.add_argument("--learning-starts", type=int, default=10_000)
    p.add_argument("--csv", required=True)
    args = p.parse_args()
    try:
        import gymnasium as gym
        from stable_baselines3 import SAC
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.evaluation import evaluate_policy
    except ImportError as exc:
        print(f"sb3_peer: {exc}; install the benchmark extra: pip install -e '.[bench,mujoco]'", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    env = gym.make(args.env)
    eval_envs = {n: make_vec_env(args.env, n_envs=n, seed=args.seed + EVAL_SEED_OFFSET)
                 for n in {args.eval_episodes, args.final_episodes}}
    model = SAC("MlpPolicy", env, seed=args.seed, learning_starts=args.learning_starts, verbose=0)
    out = open(args.csv, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(FIELDS)

    class EvalAndBudget(BaseCallback):
        def __init__(self):
            super().__init__()
            self.eval_time = 0.0

        def training_seconds(self) -> float:
            return time.perf_counter() - t0 - self.eval_time

        def evaluate(self, episodes: int, kind: str) -> None:
            trained_s = self.training_seconds()
            e0 = time.perf_counter()
            returns, _ = evaluate_policy(model, eval_envs[episodes], n_eval_episodes=episodes,
                                         deterministic=True, return_episode_rewards=True)
            self.eval_time += time.perf_counter() - e0
            row = (self.num_timesteps, round(trained_s, 2), round(time.perf_counter() - t0, 2),
                   sum(returns) / len(returns), min(returns), max(returns), kind)
            writer.writerow(row)
            out.flush()
            print(f"sb3 seed {args.seed}: {row[0]:,} env steps, {row[1]:.0f} s: {kind} eval return {row[3]:.1f}",
                  flush=True)

        def _on_step(self) -> bool:
            if self.num_timesteps % args.eval_every == 0:
                self.evaluate(args.eval_episodes, "periodic")
            return self.training_seconds() < args.budget_s

    budget = EvalAndBudget()
    model.learn(total_timesteps=args.max_steps, callback=budget)
    budget.evaluate(args.final_episodes, "final")     # the policy the budget ends with
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
