"""The engine's hand-off to its callers: one call_soon_threadsafe per step per event loop, and a reader that
fell behind gets the pending steps merged into one output with exactly the same tokens."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine.outbox import Listener, Outbox
from splice.engine_output import EngineOutput, FinishReason, Usage
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request


def test_merge_concatenates_in_order_and_keeps_the_last_finish():
    outs = [EngineOutput((1,), (-0.5,)), EngineOutput((2, 3), (-1.0, -2.0)),
            EngineOutput((4,), (-3.0,), FinishReason.LENGTH, Usage(7, 4))]
    merged = EngineOutput.merge(outs)
    assert merged == EngineOutput((1, 2, 3, 4), (-0.5, -1.0, -2.0, -3.0), FinishReason.LENGTH, Usage(7, 4))
    assert EngineOutput.merge(outs[:1]) is outs[0]
    with pytest.raises(ValueError, match="only the last"):
        EngineOutput.merge([outs[2], outs[0]])


async def test_one_handoff_per_loop_per_flush_and_order_kept():
    loop = asyncio.get_running_loop()
    calls = []
    real = loop.call_soon_threadsafe

    def counting(callback, *args):  # counts the hand-offs; the real one still runs
        calls.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counting
    try:
        a, b = Listener(loop), Listener(loop)
        outbox = Outbox()

        def engine_step(step: int) -> None:  # what the engine thread does for one step of two streams
            outbox.put(a, EngineOutput((step,)))
            outbox.put(b, EngineOutput((100 + step,)))
            Outbox.send(outbox.take())

        for step in range(3):
            t = threading.Thread(target=engine_step, args=(step,))
            t.start()
            t.join()
        assert len(calls) == 3  # one per step, not one per token per listener
        out_a, err_a = await a.take()
        out_b, err_b = await b.take()
    finally:
        del loop.call_soon_threadsafe
    # the reader was not waiting while three steps arrived: it gets them as one output, in order
    assert out_a.token_ids == (0, 1, 2) and out_b.token_ids == (100, 101, 102) and err_a is err_b is None


async def test_take_returns_outputs_before_the_error_that_ends_them():
    loop = asyncio.get_running_loop()
    listener = Listener(loop)
    boom = RuntimeError("boom")
    for item in (EngineOutput((5,)), EngineOutput((6,)), boom):
        listener.deliver(item)
    assert await listener.take() == (EngineOutput((5, 6)), boom)
    listener.deliver(boom)
    assert await listener.take() == (None, boom)
    waiting = asyncio.ensure_future(listener.take())
    await asyncio.sleep(0)
    assert not waiting.done()
    listener.deliver(EngineOutput((7,), finish_reason=FinishReason.STOP, usage=Usage(1, 1)))
    assert (await waiting)[0].finished


async def test_a_slow_reader_gets_merged_outputs_with_the_same_tokens(text_engine, monkeypatch):
    ids = random_ids(7, seed=11)
    fast, fast_outs = await collect(text_engine, text_request(ids, "fast", max_tokens=40))
    assert len(fast) == 40 and fast_outs[-1].usage == Usage(7, 40)

    # The engine thread hands a step's outputs over in `_flush`, after the finished sequence has left (`_release`):
    # the slow request's end is on its way to the reader once a flush runs after its record is gone.
    handed_over, seen, real_flush = threading.Event(), [], text_engine._flush

    def flush() -> None:
        with text_engine._lock:
            alive = any(s.request_id == "slow" for s in text_engine.requests.values())
        real_flush()
        if alive:
            seen.append(True)
        elif seen:
            handed_over.set()

    monkeypatch.setattr(text_engine, "_flush", flush)
    outs = []
    async for out in text_engine.generate(text_request(ids, "slow", max_tokens=40)):
        outs.append(out)
        if len(outs) == 1:  # a reader that stalls its loop until the engine has handed the sequence's end over
            assert handed_over.wait(60)
    assert [t for o in outs for t in o.token_ids] == fast
    assert len(outs) < len(fast) and len(outs[-1].token_ids) > 1
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].usage == Usage(7, 40)


async def test_a_stream_interval_wakes_the_reader_for_the_first_token_then_every_n_and_at_the_end():
    listener = Listener(asyncio.get_running_loop(), interval=3)
    listener.deliver(EngineOutput((1,)))
    assert await listener.take() == (EngineOutput((1,)), None)  # the first token at once: TTFT unchanged
    waiting = asyncio.ensure_future(listener.take())
    for tok in (2, 3):
        listener.deliver(EngineOutput((tok,)))
        await asyncio.sleep(0)
        assert not waiting.done()  # fewer than 3 tokens pending: the reader sleeps on
    listener.deliver(EngineOutput((4,)))
    assert await waiting == (EngineOutput((2, 3, 4)), None)
    listener.deliver(EngineOutput((5,)))
    listener.deliver(EngineOutput((6,), finish_reason=FinishReason.STOP, usage=Usage(2, 6)))
    assert await listener.take() == (EngineOutput((5, 6), finish_reason=FinishReason.STOP, usage=Usage(2, 6)), None)
    boom = RuntimeError("boom")
    for item in (EngineOutput((7,)), boom):  # an error ends the stream at once too, after what preceded it
        listener.deliver(item)
    assert await listener.take() == (EngineOutput((7,)), boom)


async def test_an_engine_with_a_stream_interval_sends_the_same_tokens_in_fewer_outputs(tiny_dirs, text_engine):
    ids = random_ids(9, seed=5)
    solo, _ = await collect(text_engine, text_request(ids, "every-token", max_tokens=23))
    engine = start_engine(tiny_dirs["tiny-text"], stream_interval=5)
    try:
        tokens, outs = await collect(engine, text_request(ids, "every-5", max_tokens=23))
    finally:
        engine.stop()
    assert tokens == solo
    sizes = [len(o.token_ids) for o in outs]
    # the first output at once (the Listener test above pins that it is not held back), then at least 5 tokens per
    # output (more when the reader lagged), the end with the last
    assert all(n >= 5 for n in sizes[1:-1]) and sum(sizes) == 23
    assert len(outs) <= 1 + -(-22 // 5) and outs[-1].finish_reason is FinishReason.LENGTH
