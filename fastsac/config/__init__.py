"""The job configuration: one YAML file -> typed, validated dataclasses. Torch-free. This package's
names are the config API every role imports; `python -m fastsac.config` prints the config-key table
of the docs.

Its modules, one job each: schema (the dataclasses: every key, its default and range), strict_yaml
(YAML read strictly), coercion (a mapping's values to their keys' types), checks (across keys),
distributed_env (torchrun's variables), overrides (`key=value`), yaml_io (files in and out),
key_table (the markdown table of every key).
"""
from fastsac.config.checks import check_binding_keys, placement_keys_set
from fastsac.config.distributed_env import resolve_distributed_env
from fastsac.config.key_table import config_keys_markdown
from fastsac.config.overrides import apply_overrides, parse_override
from fastsac.config.schema import (INT64_MAX, JOB_NAME_RE, MAX_RESTARTS, MIN_HEARTBEAT_TIMEOUT_S, MIN_STOP_TIMEOUT_S,
                                   SEED_MAX, AlgoConfig, AsyncOptions, CheckpointConfig, Config, DistributedConfig,
                                   EnvConfig, EvalConfig, LoggingConfig, TrainerConfig)
from fastsac.config.yaml_io import config_from_dict, config_to_dict, config_to_yaml, load_config
from fastsac.errors import ConfigError

__all__ = ["INT64_MAX", "JOB_NAME_RE", "MAX_RESTARTS", "MIN_HEARTBEAT_TIMEOUT_S", "MIN_STOP_TIMEOUT_S", "SEED_MAX",
           "AlgoConfig", "AsyncOptions", "CheckpointConfig", "Config", "ConfigError", "DistributedConfig", "EnvConfig",
           "EvalConfig", "LoggingConfig", "TrainerConfig", "apply_overrides", "check_binding_keys", "config_from_dict",
           "config_keys_markdown", "config_to_dict", "config_to_yaml", "load_config", "parse_override",
           "placement_keys_set", "resolve_distributed_env"]
