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
    """One GenerationChunk per engine output: an output carrying several tokens (the engine merged the steps of
    a reader that fell behind) becomes one chunk with their text merged; the prompt logprobs stay on the first.
    `drop_ids` (the sentinel IDs) are streamed as IDs but never decoded to text."""
    sampling = request.sampling
    detok = IncrementalDetokenizer(tokenizer, sampling.skip_special_tokens, drop_ids)
    stops = StopMatcher(sampling.stop, sampling.include_stop_str_in_output)
    floor = sampling.min_tokens  # stop strings match only in the text of the tokens after these (as vLLM)
    produced = 0
    outputs = engine.generate(request)
    try:
        async for out in outputs:
            if stops.active and len(out.token_ids) > 1:
                # token by token: the chunk must end at the token that completed the stop string
                text, stopped = _push_with_stops(out, detok, stops, request.prompt_len, produced, floor)
                if stopped is not None:
                    yield stopped
                    return
            else:
                text = stops.push(detok.push_many(out.token_ids), produced + len(out.token_ids) > floor)
                if stops.matched is not None:
                    # Returning closes `outputs`, which cancels the engine call: nothing more is needed.
                    yield GenerationChunk(text, out.token_ids, out.logprobs, FinishReason.STOP,
                                          Usage(request.prompt_len, produced + len(out.token_ids)), stops.matched,
                                          out.top_ids, out.top_logprobs, out.prompt_logprobs)
                    return
            produced += len(out.token_ids)
            if out.finish_reason is not None:
                text += stops.push(detok.flush(), produced > floor)
                if stops.matched is None:
                    text += stops.flush()
                usage = out.usage or Usage(request.prompt_len, produced)
                reason = FinishReason.STOP if stops.matched is not None else out.finish_reason
                yield GenerationChunk(text, out.token_ids, out.logprobs, reason, usage, stops.matched or "",
                                      out.top_ids, out.top_logprobs, out.prompt_logprobs)
                return
            if out.token_ids:
                yield GenerationChunk(text, out.token_ids, out.logprobs, top_ids=out.top_ids,
                                      top_logprobs=out.top_logprobs, prompt_logprobs=out.prompt_logprobs)
        raise Unavailable("the engine's stream ended without a final chunk")
    finally:
        await outputs.aclose()


def _push_with_stops(out: EngineOutput, detok: IncrementalDetokenizer, stops: StopMatcher, prompt_len: int,
                     produced: int, floor: int) -> tuple[str, GenerationChunk | None]:
    """Pushes `out`'s tokens one by one: the text released, and the final chunk if a stop string matched (its
    IDs end at the token that completed it)."""
    texts: list[str] = []
    k = len(out.top_ids) // len(out.token_ids)  # top_logprobs per token
    for i, token in enumerate(out.token_ids):
        texts.append(stops.push(detok.push(token), produced + i + 1 > floor))
        if stops.matched is not None:
            return "", GenerationChunk("".join(texts), out.token_ids[:i + 1], out.logprobs[:i + 1],
                                       FinishReason.STOP, Usage(prompt_len, produced + i + 1), stops.matched,
                                       out.top_ids[:(i + 1) * k], out.top_logprobs[:(i + 1) * k],
                                       out.prompt_logprobs)
    return "".join(texts), None
