"""Engine token stream -> GenerationChunks: incremental detokenization, stop strings, usage (step 7)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import replace
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
    a reader that fell behind) becomes one chunk with their text merged; the prompt logprobs stay on the first
    (choice 0's). `drop_ids` (the sentinel IDs) are streamed as IDs but never decoded to text. With n > 1 choices
    the engine's outputs of each (by index) are detokenized and stopped on their own; the stream ends once every
    choice has."""
    choices = [_Choice(i, request, tokenizer, drop_ids) for i in range(request.sampling.n)]
    unfinished = len(choices)
    outputs = engine.generate(request)
    try:
        async for out in outputs:
            choice = choices[out.index]
            if choice.done:
                # a stop string ended it here; the engine goes on to its own end (a call cannot stop one choice)
                continue
            chunk = choice.push(out)
            if chunk is not None:
                yield chunk
            if choice.done:
                unfinished -= 1
                if not unfinished:
                    # Returning closes `outputs`, which cancels the engine call when a stop string ended it
                    return
        raise Unavailable("the engine's stream ended without a final chunk")
    finally:
        await outputs.aclose()


class _Choice:
    """One choice's text: its incremental detokenization, stop strings and token count."""

    def __init__(self, index: int, request: EngineRequest, tokenizer, drop_ids: Collection[int]) -> None:
        sampling = request.sampling
        self.index = index
        self.prompt_len = request.prompt_len
        self.detok = IncrementalDetokenizer(tokenizer, sampling.skip_special_tokens, drop_ids)
        self.stops = StopMatcher(sampling.stop, sampling.include_stop_str_in_output)
        self.floor = sampling.min_tokens  # stop strings match only in the text of the tokens after these (as vLLM)
        self.produced = 0
        self.done = False

    def push(self, out: EngineOutput) -> GenerationChunk | None:
        """The chunk for the choice's next output (None when it carries nothing); `done` once it is the last."""
        stops, detok = self.stops, self.detok
        if stops.active and len(out.token_ids) > 1:
            # token by token: the chunk must end at the token that completed the stop string
            text, stopped = _push_with_stops(out, detok, stops, self.prompt_len, self.produced, self.floor)
            if stopped is not None:
                self.done = True
                return replace(stopped, index=self.index)
        else:
            text = stops.push(detok.push_many(out.token_ids), self.produced + len(out.token_ids) > self.floor)
            if stops.matched is not None:
                self.done = True
                return GenerationChunk(text, out.token_ids, out.logprobs, FinishReason.STOP,
                                       Usage(self.prompt_len, self.produced + len(out.token_ids)), stops.matched,
                                       out.top_ids, out.top_logprobs, out.prompt_logprobs, index=self.index)
        self.produced += len(out.token_ids)
        if out.finish_reason is not None:
            self.done = True
            text += stops.push(detok.flush(), self.produced > self.floor)
            if stops.matched is None:
                text += stops.flush()
            usage = out.usage or Usage(self.prompt_len, self.produced)
            reason = FinishReason.STOP if stops.matched is not None else out.finish_reason
            return GenerationChunk(text, out.token_ids, out.logprobs, reason, usage, stops.matched or "",
                                   out.top_ids, out.top_logprobs, out.prompt_logprobs, index=self.index)
        if out.token_ids:
            return GenerationChunk(text, out.token_ids, out.logprobs, top_ids=out.top_ids,
                                   top_logprobs=out.top_logprobs, prompt_logprobs=out.prompt_logprobs,
                                   index=self.index)
        return None


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
