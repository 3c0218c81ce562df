"""merge_streams: items from every stream, tagged with its index; an error in one ends the merge and closes the
others, as does closing the merge."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from preprocessor.merge import merge_streams


class Stream:
    """Yields `items` (after `gate` opens, when given), then raises `error` if set; records its close."""

    def __init__(self, items, gate: asyncio.Event | None = None, error: Exception | None = None) -> None:
        self.items, self.gate, self.error, self.closed = items, gate, error, False

    async def run(self):
        try:
            for item in self.items:
                if self.gate is not None:
                    await self.gate.wait()
                yield item
            if self.error is not None:
                raise self.error
            if self.gate is None:
                await asyncio.Event().wait()  # open: never ends by itself
        finally:
            self.closed = True


async def test_items_come_tagged_and_every_stream_is_read_to_its_end():
    gate = asyncio.Event()
    a, b = Stream(["a1", "a2"], gate), Stream(["b1"], gate)
    gate.set()
    got = [item async for item in merge_streams([a.run(), b.run()])]
    assert sorted(got) == [(0, "a1"), (0, "a2"), (1, "b1")]
    assert [x for i, x in got if i == 0] == ["a1", "a2"]  # each stream in its own order


async def test_an_error_ends_the_merge_and_closes_the_others():
    open_stream, failing = Stream(["x"]), Stream([], asyncio.Event(), error=ValueError("boom"))
    failing.gate.set()
    with pytest.raises(ValueError, match="boom"):
        _ = [item async for item in merge_streams([open_stream.run(), failing.run()])]
    assert open_stream.closed


async def test_closing_the_merge_closes_every_stream():
    a, b = Stream(["a"]), Stream(["b"])
    async with aclosing(merge_streams([a.run(), b.run()])) as merged:
        assert (await anext(merged))[1] in ("a", "b")
    assert a.closed and b.closed
