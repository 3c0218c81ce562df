"""A large JSON request body parsed off the event loop, its collections counted as they are read.

FastAPI parses a body with json.loads on the event loop, which serves every HTTP and gRPC client: json's C parser
holds the GIL for the whole body (a 29 MB logit_bias of 2M entries: 2.8 s during which no client was answered), in a
thread as much as on the loop. A body over INLINE_BODY_BYTES is parsed here instead, in a thread, before FastAPI
reads it (OffLoopJsonRoute hands FastAPI the parsed value): arrays and objects are walked by Python, so the thread
gives the GIL back every few milliseconds, and everything else (strings, numbers, flat arrays of numbers) by json's
C scanner, so that a body of long strings (images, embeddings) is as fast as json.loads.

As they are read: the top-level fields named in `caps` (logit_bias and allowed_token_ids: the vocabulary, vLLM's rule;
tools: MAX_TOOLS; messages and prompt token IDs: the context) are counted, and a body nested deeper than
MAX_BODY_DEPTH is refused, each with a 400 naming the field and the bound, before the rest of the entries become
objects. Strings holding lone surrogates are refused here too (schemas.lone_surrogate), so the models' own walk of
the whole body, on the loop, is skipped (ParsedBody).
"""

from __future__ import annotations

import asyncio
import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from preprocessor.http.schemas import ParsedBody, surrogate_free
from preprocessor.request_bounds import INLINE_REQUEST_BYTES
from splice.errors import InvalidArgument
from splice.json_depth import MAX_JSON_DEPTH
from splice.offload import gc_paused

# Bodies up to this size are left to FastAPI's json.loads on the loop (a logit_bias entry, the costliest shape to
# parse, is ~14 bytes and ~1.4 us).
INLINE_BODY_BYTES = INLINE_REQUEST_BYTES
# A body's own nesting: the JSON-typed fields' cap (their values are checked against it by field, naming it) and the
# levels above them (tools[i].function.parameters, messages[i].tool_calls[j].function).
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 4
_WS = re.compile(r"[ \t\n\r]*")
_NUMERIC = re.compile(r"[0-9 \t\n\r,.eE+\-]*")  # the inside of a flat array of numbers
_SCAN = json.scanner.c_make_scanner(json.JSONDecoder()) if json.scanner.c_make_scanner else \
    json.scanner.py_make_scanner(json.JSONDecoder())
_scanstring = json.decoder.scanstring


class _Frame:
    __slots__ = ("cap", "close", "count", "field", "key", "value", "why")

    def __init__(self, value: dict | list, field: str | None, cap: int, why: str) -> None:
        self.value, self.field, self.cap, self.why = value, field, cap, why  # field: the top-level one it is
        self.close = "}" if isinstance(value, dict) else "]"
        self.key: str | None = None
        self.count = 0


def _where(stack: list[_Frame]) -> str:
    parts = []
    for frame in stack:
        if isinstance(frame.value, dict):
            parts.append(f".{frame.key}" if frame.key is not None else "")
        else:
            parts.append(f"[{frame.count}]")
    return ("".join(parts).lstrip(".") or "body")[:200]


def _bad(text: str, at: int, what: str) -> InvalidArgument:
    return InvalidArgument(f"the request body is not valid JSON ({what.removesuffix(' at')} at character {at})")


def _over(field: str, count: int, cap: int, why: str) -> InvalidArgument:
    return InvalidArgument(f"{field} holds more than {cap} entries (at least {count}); {why}")


class Caps:
    """Entries a top-level field's array or object may hold (field -> (bound, why)), and any other array or object
    (`default`), read as the body is parsed."""

    def __init__(self, bounds: Mapping[str, tuple[int, str]], default: tuple[int, str]) -> None:
        self.bounds, self.default = dict(bounds), default

    def of(self, field: str | None) -> tuple[int, str]:
        return self.bounds.get(field, self.default) if field is not None else self.default


def parse_body(text: str, caps: Caps) -> Any:
    """`text` as json.loads reads it, or InvalidArgument: not JSON, a field past its cap, too deep, a lone surrogate."""
    stack: list[_Frame] = []
    i = _WS.match(text, 0).end()
    while True:
        if i >= len(text):
            raise _bad(text, i, "it ends early")
        c = text[i]
        field = stack[0].key if len(stack) == 1 and isinstance(stack[0].value, dict) else None
        if c == "[" and (close := text.find("]", i)) > 0 and _NUMERIC.fullmatch(text, i + 1, close):
            count = 0 if _WS.match(text, i + 1).end() == close else text.count(",", i, close) + 1
            if count > (cap := caps.of(field))[0]:
                raise _over(field or _where(stack), count, *cap)
            try:
                value = json.loads(text[i:close + 1])
            except json.JSONDecodeError as exc:
                raise _bad(text, i + exc.pos, exc.msg) from None
            i = close + 1
        elif c in "[{":
            if len(stack) >= MAX_BODY_DEPTH:
                raise InvalidArgument(f"the request body nests more than {MAX_BODY_DEPTH} levels of arrays and "
                                      f"objects (at {_where(stack)})")
            frame = _Frame({} if c == "{" else [], field, *caps.of(field))
            i = _WS.match(text, i + 1).end()
            if text.startswith(frame.close, i):
                value, i = frame.value, i + 1
            else:
                stack.append(frame)
                i = _key(text, i, frame) if c == "{" else i
                continue
        else:
            try:
                value, i = _SCAN(text, i)
            except StopIteration:
                raise _bad(text, i, "a value was expected") from None
            except json.JSONDecodeError as exc:  # (a string with a raw control character, an unfinished escape)
                raise _bad(text, exc.pos, exc.msg) from None
            if type(value) is str and not surrogate_free(value):
                raise InvalidArgument(f"{_where(stack)} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape "
                                      f"not in a pair), which is not text")
        while True:  # `value` is complete: into its container, then what follows it
            if not stack:
                if _WS.match(text, i).end() != len(text):
                    raise _bad(text, i, "extra data after the value")
                return ParsedBody(value) if isinstance(value, dict) else value
            frame = stack[-1]
            if isinstance(frame.value, dict):
                frame.value[frame.key] = value
            else:
                frame.value.append(value)
            frame.count += 1
            if frame.count > frame.cap:
                raise _over(frame.field or _where(stack[:-1]), frame.count, frame.cap, frame.why)
            i = _WS.match(text, i).end()
            if text.startswith(",", i):
                i = _WS.match(text, i + 1).end()
                if isinstance(frame.value, dict):
                    i = _key(text, i, frame)
                break
            if not text.startswith(frame.close, i):
                raise _bad(text, i, f"',' or '{frame.close}' was expected")
            value, i = stack.pop().value, i + 1


def _key(text: str, i: int, frame: _Frame) -> int:
    """Reads an object's `"key":` at `i` into `frame`; the index of its value."""
    if not text.startswith('"', i):
        raise _bad(text, i, "a property name in double quotes was expected")
    try:
        key, i = _scanstring(text, i + 1)
    except json.JSONDecodeError as exc:
        raise _bad(text, exc.pos, exc.msg) from None
    if not surrogate_free(key):
        raise InvalidArgument("a key of the request body holds a lone UTF-16 surrogate, which is not text")
    i = _WS.match(text, i).end()
    if not text.startswith(":", i):
        raise _bad(text, i, "':' was expected")
    frame.key = key
    return _WS.match(text, i + 1).end()


def _decode(raw: bytes, caps: Caps) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"the request body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    with gc_paused():  # (parsed JSON holds no cycle; full collections over its objects would hold the GIL)
        return parse_body(text, caps)


def _is_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


class OffLoopJsonRoute(APIRoute):
    """A route whose JSON body, when large, is parsed by parse_body in a thread before FastAPI's handler runs (which
    then finds it parsed: Starlette's Request.json() returns what it holds). `app.state.body_caps()` gives the caps
    of the model served now."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            raw = await request.body()
            if len(raw) > INLINE_BODY_BYTES and _is_json(request):
                request._json = await asyncio.to_thread(_decode, raw, request.app.state.body_caps())
            return await handler(request)

        return route
