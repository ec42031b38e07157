"""Layout of the flat policy vector the learner publishes to collectors. Torch-free.

`FastSAC.policy_flat()` concatenates, in this order:

  1. every actor parameter, in `Actor.named_parameters()` order, flattened row-major:
       trunk.{3i}.weight [h_i, in_i], trunk.{3i}.bias [h_i]      (Linear of hidden layer i)
       trunk.{3i+1}.weight [h_i],     trunk.{3i+1}.bias [h_i]     (its LayerNorm)
       mean_head.weight [act, h_last], mean_head.bias [act]
       log_std_head.weight [act, h_last], log_std_head.bias [act]
     where h_i are the trunk widths of `trunk_widths` (in_0 = obs_dim, in_i = h_{i-1}).
  2. the actor observation normalizer's mean [obs_dim] and var [obs_dim]
     (present even when obs_normalization is off, so the layout never depends on it).

All float32. The shared-memory layout sizes its snapshot with `policy_flat_numel` without
importing torch; a unit test checks both against the torch modules.
"""
from __future__ import annotations

from fastsac.config import AlgoConfig


def trunk_widths(hidden_dim: int, num_layers: int, shape: str) -> list[int]:
    """Output width of each hidden layer of an MLP trunk.

    tapered (the reference FastSAC's): each layer half as wide as the one before, hidden,
    hidden/2, hidden/4, ... (floor division; the config refuses a layer narrower than 1).
    uniform: every layer `hidden_dim` wide (twice the compute per update at reference sizes).
    """
    if shape == "tapered":
        return [hidden_dim >> i for i in range(num_layers)]
    if shape == "uniform":
        return [hidden_dim] * num_layers
    raise ValueError(f"unknown trunk shape {shape!r}; expected 'tapered' or 'uniform'")


def actor_widths(cfg: AlgoConfig) -> list[int]:
    return trunk_widths(cfg.actor_hidden_dim, cfg.actor_num_layers, cfg.trunk_shape)


def critic_widths(cfg: AlgoConfig) -> list[int]:
    return trunk_widths(cfg.critic_hidden_dim, cfg.critic_num_layers, cfg.trunk_shape)


def actor_param_shapes(obs_dim: int, act_dim: int, cfg: AlgoConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every actor parameter, in the flat vector's order."""
    shapes: list[tuple[str, tuple[int, ...]]] = []
    in_dim = obs_dim
    for i, h in enumerate(actor_widths(cfg)):
        # each hidden layer is Linear -> LayerNorm -> SiLU: three Sequential entries, two with parameters
        shapes += [(f"trunk.{3 * i}.weight", (h, in_dim)), (f"trunk.{3 * i}.bias", (h,)),
                   (f"trunk.{3 * i + 1}.weight", (h,)), (f"trunk.{3 * i + 1}.bias", (h,))]
        in_dim = h
    shapes += [("mean_head.weight", (act_dim, in_dim)), ("mean_head.bias", (act_dim,)),
               ("log_std_head.weight", (act_dim, in_dim)), ("log_std_head.bias", (act_dim,))]
    return shapes


def normalizer_numel(obs_dim: int) -> int:
    """mean + var of the actor observation normalizer."""
    return 2 * obs_dim


def actor_numel(obs_dim: int, act_dim: int, cfg: AlgoConfig) -> int:
    total = 0
    for _, shape in actor_param_shapes(obs_dim, act_dim, cfg):
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def policy_flat_numel(obs_dim: int, act_dim: int, cfg: AlgoConfig) -> int:
    """Exact length (float32 elements) of `FastSAC.policy_flat()`."""
    return actor_numel(obs_dim, act_dim, cfg) + normalizer_numel(obs_dim)
