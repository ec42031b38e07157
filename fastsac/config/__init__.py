"""The job configuration: one YAML file -> typed, validated dataclasses (schema.py, read strictly by
strict_yaml.py). Torch-free. This package's names are the config API every role imports;
`python -m fastsac.config` prints the config-key table of the docs.
"""
from fastsac.config.schema import (INT64_MAX, JOB_NAME_RE, MAX_RESTARTS, MIN_HEARTBEAT_TIMEOUT_S, MIN_STOP_TIMEOUT_S,
                                   SEED_MAX, AlgoConfig, AsyncOptions, CheckpointConfig, Config, DistributedConfig,
                                   EnvConfig, EvalConfig, LoggingConfig, TrainerConfig, apply_overrides,
                                   check_binding_keys, config_from_dict, config_keys_markdown, config_to_dict,
                                   config_to_yaml, load_config, parse_override, placement_keys_set,
                                   resolve_distributed_env)
from fastsac.errors import ConfigError

__all__ = ["INT64_MAX", "JOB_NAME_RE", "MAX_RESTARTS", "MIN_HEARTBEAT_TIMEOUT_S", "MIN_STOP_TIMEOUT_S", "SEED_MAX",
           "AlgoConfig", "AsyncOptions", "CheckpointConfig", "Config", "ConfigError", "DistributedConfig", "EnvConfig",
           "EvalConfig", "LoggingConfig", "TrainerConfig", "apply_overrides", "check_binding_keys", "config_from_dict",
           "config_keys_markdown", "config_to_dict", "config_to_yaml", "load_config", "parse_override",
           "placement_keys_set", "resolve_distributed_env"]
