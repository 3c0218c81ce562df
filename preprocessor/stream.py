"""Engine token stream -> GenerationChunks: incremental detokenization, stop strings, usage (step 7)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from typing import Protocol

from preprocessor.detokenizer import IncrementalDetokenizer
from preprocessor.outputs import GenerationChunk
from preprocessor.stop import StopMatcher
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_request import EngineRequest
from splice.errors import Unavailable


class EngineBackend(Protocol):
    """What the core needs of the engine (EngineClient in production)."""

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...


async def stream_generation(request: EngineRequest, engine: EngineBackend, tokenizer,
                            drop_ids: Collection[int] = ()) -> AsyncIterator[GenerationChunk]:
    """`drop_ids` (the sentinel IDs) are streamed as IDs but never decoded to text."""
    sampling = request.sampling
    detok = IncrementalDetokenizer(tokenizer, sampling.skip_special_tokens, drop_ids)
    stops = StopMatcher(sampling.stop)
    produced = 0
    outputs = engine.generate(request)
    try:
        async for out in outputs:
            texts: list[str] = []
            ids: list[int] = []
            logprobs: list[float] = []
            for i, token in enumerate(out.token_ids):
                ids.append(token)
                produced += 1
                if i < len(out.logprobs):
                    logprobs.append(out.logprobs[i])
                texts.append(stops.push(detok.push(token)))
                if stops.matched is not None:
                    # Returning closes `outputs`, which cancels the engine call: nothing more is needed.
                    yield GenerationChunk("".join(texts), tuple(ids), tuple(logprobs), FinishReason.STOP,
                                          Usage(request.prompt_len, produced), stops.matched)
                    return
            if out.finish_reason is not None:
                texts.append(stops.push(detok.flush()))
                if stops.matched is None:
                    texts.append(stops.flush())
                usage = out.usage or Usage(request.prompt_len, produced)
                reason = FinishReason.STOP if stops.matched is not None else out.finish_reason
                yield GenerationChunk("".join(texts), tuple(ids), tuple(logprobs), reason, usage,
                                      stops.matched or "")
                return
            if ids:
                yield GenerationChunk("".join(texts), tuple(ids), tuple(logprobs))
        raise Unavailable("the engine's stream ended without a final chunk")
    finally:
        await outputs.aclose()
