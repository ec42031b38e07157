"""The table of every config key, as docs/configuration.md embeds it (`python -m fastsac.config`
prints it; a test keeps the two equal): generated from the dataclasses of fastsac.config.schema."""
from __future__ import annotations

import dataclasses
import typing

from fastsac.config.coercion import type_name
from fastsac.config.schema import Config


def config_keys_markdown() -> str:
    """The table of every config key (docs/configuration.md embeds it; a test keeps them equal)."""
    rows = ["| key | type | default | valid | meaning |", "|---|---|---|---|---|"]

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, path = hints[f.name], prefix + f.name
            if dataclasses.is_dataclass(tp):
                walk(tp, path + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            meta = f.metadata
            valid = []
            if meta.get("min") is not None:
                valid.append((">" if meta.get("min_exclusive") else ">=") + f" {meta['min']}")
            if meta.get("max") is not None:
                valid.append(f"<= {meta['max']}")
            cells = [f"`{path}`", type_name(tp), f"`{default!r}`", ", ".join(valid), meta.get("help", "")]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")   # a | inside a cell

    walk(Config, "")
    return "\n".join(rows)
