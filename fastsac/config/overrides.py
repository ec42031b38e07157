"""Command-line overrides: `key.path=value`, the value read as strict YAML, applied to the mapping a
config file gave before its keys are read."""
from __future__ import annotations

from typing import Any

import yaml

from fastsac.config.strict_yaml import YamlInputError, strict_yaml_load
from fastsac.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. trainer.num_iterations=200")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: the key {key!r} is not a dotted key path")
    try:
        value = strict_yaml_load(raw) if raw.strip() else ""
    except YamlInputError as exc:
        raise ConfigError(f"override {key}: {exc.message} in value {raw!r}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {exc}") from None
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data
