"""A mapping read from YAML into the config's dataclasses (fastsac.config.schema), key by key:
unknown keys refused with the closest valid one, every value coerced to its key's type and range.

Every problem raises `ConfigError` whose message names the full dotted key path, the offending
value and what would be valid (with the closest key for a typo). The CLI turns a ConfigError into
exit code 2 before anything touches the disk.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Literal

from fastsac.config.schema import INT64_MAX
from fastsac.errors import ConfigError  # its own module: fastsac.envs.registry raises it too

_YAML_BOOL_WORDS = {False: ("off", "no", "false"), True: ("on", "yes", "true")}


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(path: str, value: Any, tp: Any, meta: dict) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads a bare off/on/no/yes as a boolean
            value = next((c for c in _YAML_BOOL_WORDS[value] if c in choices), value)
        if value not in choices:
            raise ConfigError(f"{path}: {value!r} is not valid; expected one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a {type_name(tp)} (e.g. [0, 1])")
        return [_coerce(f"{path}[{i}]", v, item_tp, meta) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            words = isinstance(value, str) and value.lower() in (*_YAML_BOOL_WORDS[False], *_YAML_BOOL_WORDS[True])
            hint = f" (YAML 1.2 reads {value} as text, not as YAML 1.1's boolean)" if words else ""
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected true or false{hint}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if isinstance(value, str) and _looks_numeric(value):
                hint = f" (YAML reads {value} as text; write the integer's digits)"
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected an integer{hint}")
        if meta.get("max") is None:
            meta = {**meta, "max": INT64_MAX}
    elif tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '3e-4' as a string; accept what float() accepts
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a number")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{path}: {value!r} is not a finite number")
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {value!r} is a {type(value).__name__}; expected a string")
        return value
    lo, hi = meta.get("min"), meta.get("max")
    too_low = lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo))
    if too_low or (hi is not None and value > hi):
        valid = [f"{'>' if meta.get('min_exclusive') else '>='} {lo}"] if lo is not None else []
        valid += [f"<= {hi}"] if hi is not None else []
        raise ConfigError(f"{path}: {value!r} is out of range; expected a value {' and '.join(valid)}")
    return value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix or "the config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields and (not isinstance(key, str) or not key.strip()):   # "": 3, a null or numeric key
            what = "is empty" if isinstance(key, str) else f"is not a name ({type(key).__name__})"
            raise ConfigError(f"{where}: the key {key!r} {what}; valid keys in {where}: {', '.join(fields)}")
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f"; did you mean '{(prefix + '.' if prefix else '') + close[0]}'?" if close else ""
            raise ConfigError(f"{path}: unknown key{hint} (valid keys in {where}: {', '.join(fields)})")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build(tp, value, path)
        else:
            kwargs[key] = _coerce(path, value, tp, dict(fields[key].metadata))
    return cls(**kwargs)
