"""Engine token stream -> GenerationChunks: incremental detokenization, stop strings, stop tokens, usage (step 5 of
a request in the preprocessor, docs/architecture.md).

A choice the engine ended on a token (an EOS, a stop_token_ids token, a grammar's end) ends as vLLM's: the token is
in its IDs and logprobs, not in its text unless include_stop_str_in_output, and its stop_reason names the token
unless it is the tokenizer's EOS (vLLM checks that one first: stop_token_ids holding it change nothing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from preprocessor.detokenizer import IncrementalDetokenizer
from preprocessor.outputs import GenerationChunk
from preprocessor.stop import StopMatcher
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_request import EngineRequest
from splice.errors import Unavailable
from splice.sampling import SamplingParams


class EngineBackend(Protocol):
    """What the core needs of the engine (EngineClient in production)."""

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...


@dataclass(frozen=True)
class EosIds:
    """The model's EOS tokens as vLLM tells them apart: `primary`, the tokenizer's, ends an answer with no
    stop_reason; the generation config's others stop it as stop_token_ids do (unless ignore_eos), named."""

    primary: int | None = None
    others: frozenset[int] = frozenset()

    @classmethod
    def of(cls, tokenizer, model_eos: Collection[int]) -> EosIds:
        primary = getattr(tokenizer, "eos_token_id", None)
        return cls(primary, frozenset(model_eos) - {primary})

    def stop_reason(self, token: int, sampling: SamplingParams) -> int | None:
        """The stop_reason of an answer the engine ended on `token`: the token, or None for the primary EOS (or a
        token that is no stop token: a grammar's end on one the request ignores)."""
        if not sampling.ignore_eos and token == self.primary:
            return None
        if token in sampling.stop_token_ids or (not sampling.ignore_eos and token in self.others):
            return token
        return None


async def stream_generation(request: EngineRequest, engine: EngineBackend, tokenizer,
                            drop_ids: Collection[int] = (), eos: EosIds = EosIds()) -> AsyncIterator[GenerationChunk]:
    """One GenerationChunk per engine output: an output carrying several tokens (the engine merged the steps of
    a reader that fell behind) becomes one chunk with their text merged; the prompt logprobs stay on the first
    (choice 0's). `drop_ids` (the sentinel IDs) are streamed as IDs but never decoded to text. With n > 1 choices
    the engine's outputs of each (by index) are detokenized and stopped on their own; the stream ends once every
    choice has."""
    choices = [_Choice(i, request, tokenizer, drop_ids, eos) for i in range(request.sampling.n)]
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

    def __init__(self, index: int, request: EngineRequest, tokenizer, drop_ids: Collection[int], eos: EosIds) -> None:
        sampling = request.sampling
        self.index = index
        self.sampling = sampling
        self.eos = eos
        self.prompt_len = request.prompt_len
        self.detok = IncrementalDetokenizer(tokenizer, sampling.skip_special_tokens, drop_ids)
        self.stops = StopMatcher(sampling.stop, sampling.include_stop_str_in_output)
        self.floor = sampling.min_tokens  # stop strings match only in the text of the tokens after these (as vLLM)
        self.produced = 0
        self.cached = 0  # its prompt positions the engine read from the prefix cache (on its first output)
        self.done = False

    def push(self, out: EngineOutput) -> GenerationChunk | None:
        """The chunk for the choice's next output (None when it carries nothing); `done` once it is the last."""
        stops, detok = self.stops, self.detok
        if out.cached_tokens is not None:
            self.cached = out.cached_tokens
        # the token the engine stopped on is not text (vLLM's detokenizer skips it), unless asked for
        stop_token = out.finish_reason is FinishReason.STOP and not self.sampling.include_stop_str_in_output
        texted = out.token_ids[:-1] if stop_token else out.token_ids
        if stops.active and len(texted) > 1:
            # token by token: the chunk must end at the token that completed the stop string
            text, stopped = _push_with_stops(out, texted, detok, stops, self._usage, self.produced, self.floor)
            if stopped is not None:
                self.done = True
                return replace(stopped, index=self.index)
        else:
            text = stops.push(detok.push_many(texted), self.produced + len(texted) > self.floor)
            if stops.matched is not None:
                self.done = True
                # (a stop string completed by text: the output's tokens all belong to it, none was left untexted
                # unless that last one was the engine's stop token, kept in the IDs as vLLM keeps it)
                return GenerationChunk(text, out.token_ids, out.logprobs, FinishReason.STOP,
                                       self._usage(self.produced + len(out.token_ids)), stops.matched,
                                       out.top_ids, out.top_logprobs, out.prompt_logprobs, index=self.index)
        self.produced += len(out.token_ids)
        if out.finish_reason is not None:
            self.done = True
            text += stops.push(detok.flush(), self.produced > self.floor)
            if stops.matched is None:
                text += stops.flush()
            usage = self._usage(out.usage.completion_tokens if out.usage else self.produced)
            reason = FinishReason.STOP if stops.matched is not None else out.finish_reason
            token = None
            if stops.matched is None and out.finish_reason is FinishReason.STOP and out.token_ids:
                token = self.eos.stop_reason(out.token_ids[-1], self.sampling)
            return GenerationChunk(text, out.token_ids, out.logprobs, reason, usage, stops.matched or "",
                                   out.top_ids, out.top_logprobs, out.prompt_logprobs, index=self.index,
                                   stop_token_id=token)
        if out.token_ids:
            return GenerationChunk(text, out.token_ids, out.logprobs, top_ids=out.top_ids,
                                   top_logprobs=out.top_logprobs, prompt_logprobs=out.prompt_logprobs,
                                   index=self.index)
        return None

    def _usage(self, completion_tokens: int) -> Usage:
        return Usage(self.prompt_len, completion_tokens, self.cached)


def _push_with_stops(out: EngineOutput, texted: Sequence[int], detok: IncrementalDetokenizer, stops: StopMatcher,
                     usage: Callable[[int], Usage], produced: int, floor: int) -> tuple[str, GenerationChunk | None]:
    """Pushes the text of `out`'s tokens (`texted`: all of them, or all but the engine's stop token) one by one: the
    text released, and the final chunk if a stop string matched (its IDs end at the token that completed it)."""
    texts: list[str] = []
    k = len(out.top_ids) // len(out.token_ids)  # top_logprobs per token
    for i, token in enumerate(texted):
        texts.append(stops.push(detok.push(token), produced + i + 1 > floor))
        if stops.matched is not None:
            return "", GenerationChunk("".join(texts), out.token_ids[:i + 1], out.logprobs[:i + 1],
                                       FinishReason.STOP, usage(produced + i + 1), stops.matched,
                                       out.top_ids[:(i + 1) * k], out.top_logprobs[:(i + 1) * k],
                                       out.prompt_logprobs)
    return "".join(texts), None
