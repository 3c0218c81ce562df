"""vLLM's `pythonic` parser (Llama 3.2 / 4's and ToolACE's format): the whole answer is a Python list of calls
with keyword arguments of literal values, `[get_weather(city="Paris"), add(a=1, b=2)]`; JSON's true / false / null
are read too. Anything else is content. Streaming: an answer that starts with "[" is held as a call."""

from __future__ import annotations

import ast
import json
from typing import Any

from preprocessor.tools.calls import Extracted, ToolCall
from preprocessor.tools.parsers import leading_hold, leading_started

MARKERS = ("[",)
JSON_NAMES = {"null": None, "true": True, "false": False}


class _NotACall(Exception):
    pass


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise _NotACall()
        return {k.value: _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Name) and node.id in JSON_NAMES:
        return JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value  # -1 parses as a unary minus
    raise _NotACall()


def _name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise _NotACall()
    return ".".join([node.id, *reversed(parts)])


def _call(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call) or node.args:
        raise _NotACall()
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise _NotACall()
        args[kw.arg] = _value(kw.value)
    return ToolCall(_name(node.func), json.dumps(args, ensure_ascii=False))


class PythonicParser:
    name = "pythonic"

    def extract(self, text: str) -> Extracted:
        body = text.strip()
        if not (body.startswith("[") and body.endswith("]")):
            return Extracted(text)
        try:
            module = ast.parse(body)
            expr = module.body[0].value if len(module.body) == 1 else None  # type: ignore[attr-defined]
            if not isinstance(expr, ast.List) or not expr.elts:
                return Extracted(text)
            calls = tuple(_call(e) for e in expr.elts)
        except (SyntaxError, ValueError, AttributeError, _NotACall, RecursionError):
            return Extracted(text)
        return Extracted(None, calls)

    def hold_from(self, text: str) -> int | None:
        return leading_hold(text, MARKERS)

    def started(self, text: str) -> bool:
        return leading_started(text, MARKERS)
