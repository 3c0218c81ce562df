"""A whole (non-streamed) answer's JSON, built off the event loop in short pieces.

An answer of n choices with logprobs can be hundreds of MB of JSON. json.dumps writes it in one call of C code that
holds the GIL throughout (seconds for such an answer, in which no other client is served, from a thread as much as on
the loop). Here the response's outer levels are walked in Python and its long lists (a choice's logprobs, tokens) are
encoded a slice at a time, so the thread building it gives the GIL back between slices. The bytes are those
Starlette's JSONResponse writes (the same json.dumps options).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse

SLICE = 256  # list items encoded per json.dumps call
# A long list whose items look small (first, middle and last each at most this many bytes of JSON) is encoded a
# slice at a time however deep it lies: such a list walked item by item cost 7.5x one json.dumps (a prompt's
# logprobs as dicts, 1,500 positions of 21: 383 vs 51 ms, all of it holding the GIL in small bites; they come
# written now, RawJSON); a completion's logprobs content is such a list
SMALL_ITEM_BYTES = 4096
SAMPLED_LISTS = 8  # lists this long or shorter (a request's choices) are walked item by item
CHUNK_BYTES = 1 << 20  # a large body is sent in chunks of about this size
WALKED_LEVELS = 6  # response -> choices -> choice -> logprobs -> content -> item: deeper values are encoded whole


@dataclass(frozen=True)
class RawJSON:
    """A value already written as JSON, in pieces (a prompt's logprobs: logprobs.py), placed in a body as it is."""

    pieces: tuple[str, ...]

    def text(self) -> str:
        return "".join(self.pieces)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def _pieces(value: Any, level: int, out: list[str]) -> None:
    if isinstance(value, RawJSON):
        out.extend(value.pieces)
    elif level >= WALKED_LEVELS or not isinstance(value, (dict, list)) or not value:
        out.append(_dumps(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            name = _dumps(key) if isinstance(key, str) else _dumps({key: None})[1:-6]  # (json's spelling of 1, true)
            out.append(("," if i else "") + name + ":")
            _pieces(item, level + 1, out)
        out.append("}")
    elif len(value) <= SLICE and level + 1 >= WALKED_LEVELS:
        out.append(_dumps(value))
    else:
        whole = level + 1 >= WALKED_LEVELS or _small_items(value)
        out.append("[")
        for i in range(0, len(value), SLICE):
            if whole:
                try:
                    out.append(("," if i else "") + _dumps(value[i:i + SLICE])[1:-1])
                    continue
                except TypeError:  # a RawJSON inside, which json.dumps cannot write: these items are walked
                    whole = False
            for j, item in enumerate(value[i:i + SLICE], start=i):
                if j:
                    out.append(",")
                _pieces(item, level + 1, out)
        out.append("]")


def _small_items(items: list) -> bool:
    """Whether a list is long and its items, sampled, small enough to be encoded SLICE at a time."""
    if len(items) <= SAMPLED_LISTS:
        return False
    try:
        return all(len(_dumps(items[i])) <= SMALL_ITEM_BYTES for i in (0, len(items) // 2, -1))
    except TypeError:  # a RawJSON inside (many choices, each with its prompt's logprobs): walked
        return False


def json_chunks(value: Any) -> list[bytes]:
    """`value` as JSONResponse would render it, encoded a piece at a time, in chunks of about CHUNK_BYTES."""
    out: list[str] = []
    _pieces(value, 0, out)
    chunks, group, size = [], [], 0
    for piece in out:
        group.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES:
            chunks.append("".join(group).encode("utf-8"))
            group, size = [], 0
    if group or not chunks:
        chunks.append("".join(group).encode("utf-8"))
    return chunks


def json_bytes(value: Any) -> bytes:
    return b"".join(json_chunks(value))


def json_response(value: Any) -> Response:
    """One body, or for a large one its chunks sent one after another (never joined: a join of hundreds of MB, and
    the socket buffer's copy of it, would hold the loop), with its Content-Length."""
    chunks = json_chunks(value)
    if len(chunks) == 1:
        return Response(chunks[0], media_type="application/json")
    length = str(sum(len(c) for c in chunks))
    return StreamingResponse(iter(chunks), media_type="application/json", headers={"content-length": length})
