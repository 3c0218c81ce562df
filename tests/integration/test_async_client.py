"""The asyncio client against the real services: streaming, unary calls, errors, early close."""

from __future__ import annotations

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
