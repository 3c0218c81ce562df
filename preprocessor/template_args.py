"""vLLM's chat request fields that reach the template as arguments: `documents` and `reasoning_effort`, merged over
the caller's chat_template_kwargs. One function for both faces (http/convert.py, convert.py), on plain values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from splice.errors import InvalidArgument

# vLLM's reasoning_effort values (OpenAI's, and "none" to turn thinking off)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _documents(documents: Sequence[Any]) -> list[dict[str, str]]:
    """vLLM's type, list[dict[str, str]]: each document an object of strings (the HTTP schema checks it as it
    parses; a gRPC Struct may hold any JSON value)."""
    out = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, Mapping):
            raise InvalidArgument(f"documents[{i}] must be an object of strings (e.g. title, text), got "
                                  f"{type(doc).__name__}")
        for key, value in doc.items():
            if not isinstance(value, str):
                raise InvalidArgument(f"documents[{i}].{key} must be a string, got {type(value).__name__}")
        out.append(dict(doc))
    return out


def template_arguments(chat_template_kwargs: Mapping[str, Any] | None, documents: Sequence[Any] | None,
                       reasoning_effort: str | None, tools: Sequence[Any] | None = None) -> dict[str, Any]:
    """chat_template_kwargs, then the request's own template arguments where set (vLLM's merge: those win):
    `tools` (checked: preprocessor/tools/request.checked_tools), `documents`, and `reasoning_effort` (which also
    turns thinking on or off unless chat_template_kwargs says)."""
    kwargs = dict(chat_template_kwargs or {})
    if tools:
        kwargs["tools"] = list(tools)
    if documents is not None:
        kwargs["documents"] = _documents(documents)
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise InvalidArgument(f"reasoning_effort must be one of {list(REASONING_EFFORTS)}, got "
                                  f"{reasoning_effort[:40]!r}")
        kwargs["reasoning_effort"] = reasoning_effort
        kwargs.setdefault("enable_thinking", reasoning_effort != "none")
    return kwargs
