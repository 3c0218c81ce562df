"""How deep a JSON value nests, measured from its shape without recursion, and the one cap every JSON-typed field
shares (tools, tool call arguments, schemas and structured specs, template arguments, a model's tool calls).

Whatever reads JSON later recurses on it: Python's json (C, within the interpreter's recursion limit), jsonschema
(several Python frames per level), templates' tojson, xgrammar's JSON-schema converter (whose time grows with the
cube of the depth: 100 levels take 20 ms, 1000 take a minute). So a value deeper than MAX_JSON_DEPTH is refused
(InvalidArgument naming the part and its depth) before any of those sees it, or, for a model's own output, read as
text (`loads` raises ValueError, as a parse failure does).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from splice.errors import InvalidArgument

# Levels of arrays and objects a JSON value may nest (a schema with 15 levels of object properties is 31: each level
# is the property's schema and its `properties` object). OpenAI's structured outputs allow 10 levels of schemas.
MAX_JSON_DEPTH = 32
# A structured output's spec: the schema tool_choice "required" implies wraps a tool's parameters (at most
# MAX_JSON_DEPTH - 2 deep within the tool) in 5 levels of its own (preprocessor/tools/choice.py).
MAX_SPEC_DEPTH = MAX_JSON_DEPTH + 3
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def text_depth(text: str) -> int:
    """The deepest nesting of [ and { outside JSON strings in `text` (an unclosed one counts as open): how deep a JSON
    parser would recurse on it. Linear, done by the regex engine and itertools, not by a Python loop per character."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) if brackets else 0


def value_depth(value: Any) -> int:
    """How deep a parsed JSON value (dicts, lists, scalars) nests: 0 for a scalar, 1 for a flat list. Iterative."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def _refuse(where: str, depth: int, limit: int) -> InvalidArgument:
    return InvalidArgument(f"{where} nests {depth} levels of arrays and objects; at most {limit}")


def check_value(value: Any, where: str, limit: int = MAX_JSON_DEPTH) -> None:
    """InvalidArgument naming `where` and its depth when `value` nests deeper than `limit`."""
    if (depth := value_depth(value)) > limit:
        raise _refuse(where, depth, limit)


def check_text(text: str, where: str, limit: int = MAX_JSON_DEPTH) -> None:
    """InvalidArgument naming `where` and its depth when the JSON text `text` nests deeper than `limit`."""
    if (depth := text_depth(text)) > limit:
        raise _refuse(where, depth, limit)


class TooDeep(ValueError):
    """JSON text nested deeper than MAX_JSON_DEPTH: a parse failure (ValueError) for callers that read JSON text
    leniently, as the tool parsers read a model's output."""


def loads(text: str, **kwargs: Any) -> Any:
    """json.loads of `text` once its depth is within MAX_JSON_DEPTH; TooDeep (a ValueError) otherwise."""
    if (depth := text_depth(text)) > MAX_JSON_DEPTH:
        raise TooDeep(f"JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH}")
    return json.loads(text, **kwargs)
