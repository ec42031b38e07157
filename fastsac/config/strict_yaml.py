"""YAML as a job config reads it: no aliases, no merge keys, no duplicate keys, and YAML 1.2's
core schema for what is a number or a boolean.

PyYAML would silently keep the last of two equal keys, recurse forever on a self-referencing
alias and expand a few hundred bytes of nested aliases into gigabytes; a job config needs none
of that. PyYAML also reads YAML 1.1, where `0100` is 64 (octal), `1:20` is 80 (base 60),
`1_000` is 1000 and `off`/`yes`/`on`/`NO` are booleans; in YAML 1.2 (every other current YAML
reader) the first is 100 and the others are strings. The words are read as YAML 1.2 reads them,
as text (`numa_binding: off` is the word off; a boolean key given `off` is refused by the config's
type check, naming it); a number that the two read differently is refused here, naming the key,
what each reads and what to write instead.
`YamlInputError` names the line of the offending construct.
"""
from __future__ import annotations

import math
import re
from typing import Any

import yaml


class YamlInputError(yaml.YAMLError):
    """YAML that parses but a job config refuses (empty, duplicate key, alias), with its line."""

    def __init__(self, message: str, line: int):
        super().__init__(f"line {line}: {message}")
        self.message, self.line = message, line


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases while composing, before anything can be expanded."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise YamlInputError(f"alias *{event.anchor}: YAML aliases are not allowed in a job config; write the "
                                 "value out", event.start_mark.line + 1)
        return super().compose_node(parent, index)


_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
# YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2): the plain scalars that are not strings
_CORE_NULL = re.compile(r"null|Null|NULL|~|")
_CORE_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE")
_CORE_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_CORE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_CORE_SPECIAL = {".inf": math.inf, ".Inf": math.inf, ".INF": math.inf, "+.inf": math.inf, "+.Inf": math.inf,
                 "+.INF": math.inf, "-.inf": -math.inf, "-.Inf": -math.inf, "-.INF": -math.inf,
                 ".nan": math.nan, ".NaN": math.nan, ".NAN": math.nan}


def core_value(text: str) -> Any:
    """What YAML 1.2's core schema makes of a plain (unquoted) scalar."""
    if _CORE_NULL.fullmatch(text):
        return None
    if _CORE_BOOL.fullmatch(text):
        return text.lower() == "true"
    if _CORE_INT.fullmatch(text):
        return int(text[2:], 8) if text.startswith("0o") else int(text, 16 if text.startswith("0x") else 10)
    if _CORE_FLOAT.fullmatch(text):
        return float(text)
    return _CORE_SPECIAL.get(text, text)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def _spelled(value: Any) -> str:
    if isinstance(value, str):
        return f"{value!r} in quotes"
    return "true" if value is True else "false" if value is False else repr(value)


def _check_scalar(loader: _StrictLoader, node: yaml.ScalarNode, name: str) -> None:
    """A plain scalar that YAML 1.1 (PyYAML) reads as a boolean word becomes YAML 1.2's text; one it
    reads as a number other than YAML 1.2's is refused. (Text that only YAML 1.2 reads as a number,
    e.g. 1e3, stays the string PyYAML gives: the config's type check names it.)"""
    if node.style is not None:      # quoted or block text: a string either way
        return
    old, new = loader.construct_object(node, deep=True), core_value(node.value)
    if isinstance(old, bool) and isinstance(new, str):   # on/off/yes/no/y/n: YAML 1.2's word
        node.tag = _STR_TAG
        loader.constructed_objects.pop(node, None)       # constructed again, as the string
        return
    if not isinstance(old, str) and not _same(old, new):
        where = f"{name}: " if name else ""
        raise YamlInputError(f"{where}{node.value} is {old!r} in YAML 1.1 but {new!r} in YAML 1.2, which a job "
                             f"config follows (write {_spelled(new)} or {_spelled(old)}, whichever you mean)",
                             node.start_mark.line + 1)


def _check_keys(loader: _StrictLoader, node: yaml.Node, path: str) -> None:
    """Refuse duplicate keys (PyYAML keeps the last one silently), merge keys, and keys and values
    that YAML 1.1 and 1.2 read differently."""
    if isinstance(node, yaml.ScalarNode):
        _check_scalar(loader, node, path)
        return
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_keys(loader, item, f"{path}[{i}]")
        return
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == _MERGE_TAG:
            raise YamlInputError("merge key '<<' is not allowed in a job config; write the keys out", line)
        if isinstance(key_node, yaml.ScalarNode):
            _check_scalar(loader, key_node, f"{path}.{key_node.value}" if path else f"key {key_node.value}")
        key = loader.construct_object(key_node, deep=True)
        name = f"{path}.{key}" if path else str(key)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: construct_document reports it
            continue
        if first is not None:
            raise YamlInputError(f"duplicate key {name!r} (first at line {first}); every key may appear once", line)
        seen[key] = line
        _check_keys(loader, value_node, name)


def strict_yaml_load(text: str) -> Any:
    """yaml.safe_load without aliases, merge keys or duplicate keys (YamlInputError names the line)."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_keys(loader, node, "")
        return loader.construct_document(node)
    except RecursionError:
        raise YamlInputError("nested too deeply", 1) from None
    finally:
        loader.dispose()
