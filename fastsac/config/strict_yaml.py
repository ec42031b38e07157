"""YAML as a job config reads it: no aliases, no merge keys, no duplicate keys.

PyYAML would silently keep the last of two equal keys, recurse forever on a self-referencing
alias and expand a few hundred bytes of nested aliases into gigabytes; a job config needs none
of that. `YamlInputError` names the line of the offending construct.
"""
from __future__ import annotations

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


def _check_keys(loader: _StrictLoader, node: yaml.Node, path: str) -> None:
    """Refuse duplicate keys (PyYAML keeps the last one silently) and merge keys."""
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
