"""A checkpoint for the fastsac-export tests, written by the run's own save path
(fastsac.training.state.save) from a FastSAC agent whose observation normalizer has non-trivial statistics."""
from __future__ import annotations

from pathlib import Path

import torch

from fastsac.config import config_from_dict
from fastsac.envs.registry import EnvSpec, make_env
from fastsac.training import state as run_state


def make_checkpoint(tmp_path: Path, task: str):
    """(checkpoint path, the FastSAC agent it holds) written by run_state.save."""
    cfg = config_from_dict({"run_dir": str(tmp_path / "run"), "device": "cpu", "env": {"name": task, "num_envs": 4},
                            "algo": {"actor_hidden_dim": 32, "critic_hidden_dim": 32, "actor_num_layers": 2,
                                     "critic_num_layers": 2, "num_atoms": 11, "buffer_size": 8}})
    env = make_env(task, 1, seed=0)
    spec = EnvSpec(env.obs_dim, env.critic_obs_dim, env.act_dim, env.max_episode_steps)
    torch.manual_seed(0)
    agent, _ = run_state.build_agent(cfg, spec, env.action_low, env.action_high, torch.device("cpu"))
    env.close()
    g = torch.Generator().manual_seed(1)
    # statistics far from (0, 1): mean ~ 2 + index, std ~ 0.5..3
    shift, scale = torch.arange(spec.obs_dim) + 2.0, 0.5 + 2.5 * torch.rand(spec.obs_dim, generator=g)
    agent.update_normalizers(shift + scale * torch.randn(256, spec.obs_dim, generator=g), None)
    with torch.no_grad():   # a trained-looking mean head (it starts at zero), big enough that tanh saturates for some inputs
        w = agent.actor.mean_head.weight
        w.copy_(torch.randn(w.shape, generator=g) * 2.0)
    return run_state.save(cfg, spec, agent, env_steps=64), agent
