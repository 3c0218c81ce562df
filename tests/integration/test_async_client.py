"""The asyncio client against the real services: streaming, unary calls, errors, early close."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from clients import AsyncSpliceClient, SpliceClientError


async def test_async_client_streams_tokenizes_and_raises(stack, mixed_messages):
    _, pre = stack
    async with AsyncSpliceClient(pre.address, timeout=120) as client:
        await client.wait_ready()
        info = await client.model_info()
        tokenized = await client.tokenize(mixed_messages)
        chunks = [c async for c in client.chat(mixed_messages, temperature=0.0, max_tokens=6, ignore_eos=True)]
        assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 6
        assert chunks[-1].usage.prompt_tokens == len(tokenized.token_ids)
        ids = [t for c in chunks for t in c.token_ids]
        # the streamed text is the detokenization of the streamed IDs
        assert "".join(c.text for c in chunks) == await client.detokenize(ids)

        with pytest.raises(SpliceClientError) as err:
            _ = [c async for c in client.complete([[info.vocab_rows]], max_tokens=1)]
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT

        # concurrent streams on one channel, one of them abandoned early
        long = client.chat([{"role": "user", "content": "story"}], temperature=0.0, max_tokens=500, ignore_eos=True)
        first = await anext(long)
        await long.aclose()
        short = [c async for c in client.complete([[1, 2, 3]], temperature=0.0, max_tokens=3, ignore_eos=True)]
        assert first.token_ids and short[-1].usage.completion_tokens == 3


async def test_a_client_that_falls_behind_gets_merged_chunks_with_the_same_answer(stack):
    # Each hop's reader has a small receive window (splice/grpc_options.py): a client that stops reading holds
    # the preprocessor's writes back, which holds the engine's back, and the tokens waiting meanwhile arrive
    # merged (IDs concatenated, text deltas joined, finish and usage on the last chunk).
    _, pre = stack
    messages = [{"role": "user", "content": "Tell a long story."}]
    params = dict(temperature=0.0, max_tokens=80, ignore_eos=True)
    async with AsyncSpliceClient(pre.address, timeout=120) as client:
        fast = [c async for c in client.chat(messages, **params)]
        slow = []
        async for chunk in client.chat(messages, **params):
            slow.append(chunk)
            if len(slow) == 1:
                await asyncio.sleep(3.0)  # the engine finishes the sequence meanwhile
    ids = [t for c in fast for t in c.token_ids]
    assert len(ids) == 80 and [t for c in slow for t in c.token_ids] == ids
    assert "".join(c.text for c in slow) == "".join(c.text for c in fast)
    assert len(slow) < len(fast) and max(len(c.token_ids) for c in slow) > 1
    # (the second answer's prompt is read from the prefix cache: its usage's cached_tokens says so)
    assert slow[-1].finish_reason == "length" and _counts(slow[-1].usage) == _counts(fast[-1].usage)


def _counts(usage) -> tuple[int, int]:
    return usage.prompt_tokens, usage.completion_tokens
