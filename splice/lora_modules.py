"""`--lora-modules` values as vLLM takes them: `NAME=PATH`, or a JSON object {"name": ..., "path": ...,
"base_model_name": ...} (base_model_name is accepted and not used: every adapter's parent is the served model)."""

from __future__ import annotations

import json


def parse_lora_module(value: str) -> tuple[str, str]:
    """One --lora-modules value -> (name, path); ValueError naming what is wrong."""
    text = value.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules: invalid JSON {value!r}: {exc}") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("path"), str):
            raise ValueError(f"--lora-modules: {value!r} needs string fields \"name\" and \"path\"")
        unknown = set(spec) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"--lora-modules: {value!r} has unknown fields {sorted(unknown)}")
        name, path = spec["name"], spec["path"]
    else:
        name, eq, path = text.partition("=")
        if not eq:
            raise ValueError(f"--lora-modules: {value!r} is neither NAME=PATH nor a JSON object with name and path")
    if not name or not path:
        raise ValueError(f"--lora-modules: {value!r} has an empty name or path")
    return name, path


def parse_lora_modules(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(parse_lora_module(v) for v in values or ())
