"""A job config in and out: a YAML file (or a mapping) plus overrides to a validated Config, and a
Config back to a mapping or YAML.

YAML is read strictly (`load_config` and every override): an empty file, a duplicate key and any
alias are errors with the file and line. PyYAML would silently run an empty file with every
default, keep the last of two equal keys, recurse forever on a self-referencing alias and expand a
few hundred bytes of nested aliases into gigabytes; a job config needs none of that.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from fastsac.config.checks import check_cross_fields
from fastsac.config.coercion import build
from fastsac.config.overrides import apply_overrides
from fastsac.config.schema import Config
from fastsac.config.strict_yaml import YamlInputError, strict_yaml_load
from fastsac.errors import ConfigError


def config_from_dict(data: dict | None, overrides: list[str] = ()) -> Config:
    data = apply_overrides(dict(data or {}), list(overrides))
    cfg = build(Config, data, "")
    check_cross_fields(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Load and validate a job config. Raises ConfigError (exit 2) on any problem.

    The one place a config file is read: the launcher, the sync trainer, the learner and every
    collector process all come through here.
    """
    data: dict = {}
    if path is not None:
        p = Path(path)
        where = f"config file {str(p)!r}"
        if not p.is_file():
            raise ConfigError(f"{where} does not exist" if not p.exists() else f"{where} is not a regular file")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {exc}") from None
        try:
            data = strict_yaml_load(text)
        except YamlInputError as exc:
            raise ConfigError(f"{where}, line {exc.line}: {exc.message}") from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            context = f" ({exc.context})" if exc.context else ""
            raise ConfigError(f"{where}{at}: not valid YAML: {exc.problem}{context}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where} is not valid YAML: {exc}") from None
        if data is None:  # an empty or truncated file would otherwise run with every default
            raise ConfigError(f"{where}, line 1: no settings (the file is empty or only comments); a job config "
                              "sets at least job_name (write {} to run with every default)")
        if not isinstance(data, dict):
            raise ConfigError(f"{where}, line 1: expected a mapping of keys at the top, got {type(data).__name__}")
    return config_from_dict(data, overrides)


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
