"""What the engine streams back for an EngineRequest: plain data, converted to protobuf only here."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from splice.prompt_logprobs import PromptLogprobs, split_messages
from splice.v1 import common_pb2, engine_pb2


class FinishReason(enum.StrEnum):
    """Why a sequence ended. A str, so `reason == "stop"` holds and metrics labels are its value."""

    STOP = "stop"  # EOS, a stop token ID or a stop string
    LENGTH = "length"  # max_tokens reached or the context (max_model_len) is full
    TOOL_CALLS = "tool_calls"  # the preprocessor's, for a Chat answer that is tool calls; never the engine's
    ABORT = "abort"  # the client cancelled; engine-internal, the stream ends with CANCELLED
    ERROR = "error"  # the request failed inside the engine; engine-internal, the stream ends with an error status

    @property
    def on_wire(self) -> bool:
        """STOP, LENGTH (and the preprocessor's TOOL_CALLS) travel in messages; ABORT and ERROR end a stream with a
        status instead."""
        return self in _TO_PB

    def to_pb(self) -> common_pb2.FinishReason:
        if not self.on_wire:
            raise ValueError(f"finish reason {self.value!r} is not sent on the wire; it ends the call with a status")
        return _TO_PB[self]

    @classmethod
    def from_pb(cls, pb: common_pb2.FinishReason) -> FinishReason | None:
        """None for FINISH_REASON_UNSPECIFIED (not finished) and for values this build does not know."""
        return _FROM_PB.get(pb)


_TO_PB = {FinishReason.STOP: common_pb2.FINISH_REASON_STOP, FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
          FinishReason.TOOL_CALLS: common_pb2.FINISH_REASON_TOOL_CALLS}
_FROM_PB = {v: k for k, v in _TO_PB.items()}


def finish_reason_to_pb(reason: FinishReason | None) -> common_pb2.FinishReason:
    """FINISH_REASON_UNSPECIFIED for None: every chunk but the last."""
    return common_pb2.FINISH_REASON_UNSPECIFIED if reason is None else reason.to_pb()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # positions in the prompt: text, image and prompt-embedding positions alike
    completion_tokens: int  # tokens generated
    cached_tokens: int = 0  # of the prompt's positions, those read from the engine's prefix cache

    def to_pb(self) -> common_pb2.Usage:
        return common_pb2.Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                                cached_tokens=self.cached_tokens)

    @classmethod
    def from_pb(cls, pb: common_pb2.Usage) -> Usage:
        return cls(pb.prompt_tokens, pb.completion_tokens, pb.cached_tokens)


@dataclass(frozen=True)
class EngineOutput:
    """One GenerateResponse: the tokens of one step; the last output carries the finish reason and usage."""

    token_ids: tuple[int, ...]  # tokens produced since the previous output (one per decode step)
    logprobs: tuple[float, ...] = ()  # same length as token_ids when asked, else empty
    finish_reason: FinishReason | None = None  # set on the last output only; STOP or LENGTH
    usage: Usage | None = None  # set on the last output only
    # with top_logprobs = k: the k most likely tokens at each step and their logprobs, k per token in token order
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()
    # with SamplingParams.prompt_logprobs: the prompt's, on the output carrying the first token (choice 0's when n > 1)
    prompt_logprobs: PromptLogprobs | None = None
    index: int = 0  # which of the request's n choices (SamplingParams.n) these tokens belong to
    # with a choice's first token: its prompt positions read from the prefix cache (usage's cached_tokens)
    cached_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.finish_reason is not None:
            reason = FinishReason(self.finish_reason)  # ValueError for an unknown string
            if not reason.on_wire:
                raise ValueError(f"finish reason {reason.value!r} ends a stream with a status, not an output")
            object.__setattr__(self, "finish_reason", reason)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def merge(cls, outputs: list[EngineOutput]) -> EngineOutput:
        """Consecutive outputs of one choice as one (a reader that fell behind): tokens and logprobs
        concatenated in order, finish reason and usage from the last. Only the last may be finished."""
        if len(outputs) == 1:
            return outputs[0]
        if any(o.finished for o in outputs[:-1]):
            raise ValueError("only the last of the merged outputs may be finished")
        last = outputs[-1]
        if any(o.index != last.index for o in outputs):
            raise ValueError("merged outputs must belong to one choice")
        return cls(tuple(t for o in outputs for t in o.token_ids), tuple(lp for o in outputs for lp in o.logprobs),
                   last.finish_reason, last.usage, tuple(t for o in outputs for t in o.top_ids),
                   tuple(lp for o in outputs for lp in o.top_logprobs),
                   next((o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None), None), last.index,
                   next((o.cached_tokens for o in outputs if o.cached_tokens is not None), None))

    def to_pb(self, prompt_logprobs: PromptLogprobs | None = None) -> engine_pb2.GenerateResponse:
        """`prompt_logprobs`: the piece this message carries (to_pbs), default the output's own."""
        pb = engine_pb2.GenerateResponse(token_ids=self.token_ids, logprobs=self.logprobs, top_token_ids=self.top_ids,
                                         top_logprobs=self.top_logprobs, index=self.index)
        if self.finish_reason is not None:
            pb.finish_reason = self.finish_reason.to_pb()
            if self.usage is not None:
                pb.usage.CopyFrom(self.usage.to_pb())
        plp = prompt_logprobs or self.prompt_logprobs
        if plp is not None:
            pb.prompt_logprobs.CopyFrom(plp.to_pb())
        if self.cached_tokens is not None:
            pb.cached_tokens = self.cached_tokens
        return pb

    def to_pbs(self) -> list[engine_pb2.GenerateResponse]:
        """This output's messages: one, or with a long prompt's logprobs their leading pieces first, each alone
        (splice/prompt_logprobs.py), so that none nears gRPC's message size limit."""
        return split_messages(self.prompt_logprobs, self.to_pb,
                              lambda piece: engine_pb2.GenerateResponse(prompt_logprobs=piece.to_pb(),
                                                                       index=self.index))

    @classmethod
    def from_pb(cls, pb: engine_pb2.GenerateResponse) -> EngineOutput:
        """A message carrying a piece of a long prompt's logprobs gives it as it is; a receiver joins the pieces
        (splice.prompt_logprobs.Pieces)."""
        finish = FinishReason.from_pb(pb.finish_reason)
        usage = Usage.from_pb(pb.usage) if finish is not None else None
        plp = PromptLogprobs.from_pb(pb.prompt_logprobs) if pb.HasField("prompt_logprobs") else None
        return cls(tuple(pb.token_ids), tuple(pb.logprobs), finish, usage, tuple(pb.top_token_ids),
                   tuple(pb.top_logprobs), plp, pb.index,
                   pb.cached_tokens if pb.HasField("cached_tokens") else None)
