"""The core's Chat/Complete streams over an engine backend: deltas, usage, stop strings, cancellation.

The engine here is a scripted backend (the engine is not what is under test): it replays the token IDs
of a reference text, derived from the model's tokenizer.
"""

from __future__ import annotations

import asyncio

import pytest

from preprocessor.answer import chat, complete
from preprocessor.content import Text, Where
from preprocessor.core import PreprocessorCore
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.errors import SpliceError
from splice.sampling import SamplingParams
from tests.preprocessor.pp_factories import chat_chunks, conversation


class ScriptedEngine:
    def __init__(self, token_ids: list[int], final: bool = True, per_output: int = 1, delay: float = 0.0) -> None:
        self.token_ids, self.final, self.per_output, self.delay = token_ids, final, per_output, delay
        self.requests = []
        self.sent = 0
        self.closed = asyncio.Event()

    async def generate(self, request):
        self.requests.append(request)
        try:
            ids = self.token_ids
            for start in range(0, len(ids), self.per_output):
                await asyncio.sleep(self.delay)
                batch = tuple(ids[start:start + self.per_output])
                self.sent += len(batch)
                last = self.final and start + self.per_output >= len(ids)
                yield EngineOutput(batch, finish_reason=FinishReason.LENGTH if last else None,
                                   usage=Usage(request.prompt_len, len(ids)) if last else None)
        finally:
            self.closed.set()


ANSWER = "The café serves 世界 coffee. Then it stops here and never continues."


@pytest.mark.parametrize("per_output", [1, 3])
async def test_deltas_ids_and_usage(tiny, per_output):
    files, info = tiny["tiny-text"]
    ids = files.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(ids, per_output=per_output)
    core = PreprocessorCore(files, info, engine)
    chunks = await chat_chunks(core, conversation(("user", "Hi")), SamplingParams())
    assert "".join(c.text for c in chunks) == ANSWER
    assert [t for c in chunks for t in c.token_ids] == ids
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    final = chunks[-1]
    prompt_len = engine.requests[0].prompt_len
    assert final.finish_reason is FinishReason.LENGTH and final.usage == Usage(prompt_len, len(ids))


async def test_stop_string_ends_output_and_cancels_engine(tiny):
    files, info = tiny["tiny-text"]
    ids = files.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(ids)
    core = PreprocessorCore(files, info, engine)
    chunks = await chat_chunks(core, conversation(("user", "Hi")), SamplingParams(stop=("stops",)))
    text = "".join(c.text for c in chunks)
    assert text == ANSWER[:ANSWER.index("stops")]
    final = chunks[-1]
    assert final.finish_reason is FinishReason.STOP and final.stop_reason == "stops"
    assert engine.closed.is_set() and engine.sent < len(ids)
    assert final.usage.completion_tokens == sum(len(c.token_ids) for c in chunks) == engine.sent


async def test_closing_the_stream_closes_the_engine_call(tiny):
    files, info = tiny["tiny-text"]
    engine = ScriptedEngine(list(range(3, 100)) * 10, final=False, delay=0.001)
    core = PreprocessorCore(files, info, engine)
    stream = complete(core, [Text("Hello", Where(None, 0))], SamplingParams())
    await anext(stream)
    await stream.aclose()
    assert engine.closed.is_set()


async def test_cancelling_the_consumer_task_closes_the_engine_call(tiny):
    files, info = tiny["tiny-text"]
    engine = ScriptedEngine(list(range(3, 100)) * 100, final=False, delay=0.01)
    core = PreprocessorCore(files, info, engine)

    async def consume():
        async for _ in chat(core, conversation(("user", "Hi")), SamplingParams()):
            pass

    task = asyncio.create_task(consume())
    while engine.sent < 3:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.closed.is_set()


async def test_engine_stream_without_final_chunk_is_unavailable(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info, ScriptedEngine([5, 6], final=False))
    with pytest.raises(SpliceError) as exc:
        await chat_chunks(core, conversation(("user", "Hi")), SamplingParams())
    assert exc.value.code == "UNAVAILABLE" and "without a final chunk" in exc.value.message


async def test_rejections_happen_before_the_engine_is_contacted(tiny):
    files, info = tiny["tiny-text"]
    engine = ScriptedEngine([5])
    core = PreprocessorCore(files, info, engine)
    with pytest.raises(SpliceError):
        await chat_chunks(core, conversation(("user", "<|splice_prompt_embeds|>")), SamplingParams())
    assert engine.requests == []
