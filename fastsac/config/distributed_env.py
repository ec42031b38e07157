"""The multi-machine keys of `distributed` left absent, filled from torchrun's environment variables
(NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT), else from the single-machine defaults."""
from __future__ import annotations

import typing

from fastsac.config.schema import DistributedConfig
from fastsac.errors import ConfigError

# torchrun's variables, read where the distributed key is left at its "absent" value
_DIST_ENV = {"nnodes": ("NNODES", 0, 1), "node_rank": ("NODE_RANK", -1, 0),
             "master_addr": ("MASTER_ADDR", "", "127.0.0.1"), "master_port": ("MASTER_PORT", 0, 29500)}


def resolve_distributed_env(dist: DistributedConfig, environ: typing.Mapping[str, str]) -> None:
    """Fill the multi-machine keys left absent from torchrun-style environment variables, then
    from the single-machine defaults. Explicit keys (file or command line) always win."""
    for key, (var, absent, default) in _DIST_ENV.items():
        if getattr(dist, key) != absent:
            continue
        raw = environ.get(var, "").strip()
        if not raw:
            setattr(dist, key, default)
            continue
        if isinstance(default, int):
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"distributed.{key}: ${var}={raw!r} is not an integer; set the variable to "
                                  f"an integer or give distributed.{key} explicitly") from None
            lo = {"nnodes": 1, "node_rank": 0, "master_port": 1}[key]
            hi = {"nnodes": 4096, "node_rank": 4095, "master_port": 65535}[key]
            if not lo <= value <= hi:
                raise ConfigError(f"distributed.{key}: ${var}={value} is out of range; expected {lo}..{hi}")
            setattr(dist, key, value)
        else:
            setattr(dist, key, raw)
