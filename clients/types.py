"""What the clients return: plain dataclasses, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass

from splice.engine_output import FinishReason, Usage
from splice.v1 import preprocessor_pb2


@dataclass(frozen=True)
class Chunk:
    text: str  # text since the previous chunk
    token_ids: tuple[int, ...]  # tokens since the previous chunk
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None  # STOP | LENGTH on the final chunk (== "stop" | "length")
    usage: Usage | None = None  # final chunk only
    stop_reason: str = ""  # the stop string that matched, if any
    # with top_logprobs = k: for each token, the k most likely tokens at its step, (token ID, logprob), most likely
    # first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    index: int = 0  # which of the request's n choices it belongs to (each ends with its own final chunk)

    @classmethod
    def from_pb(cls, pb: preprocessor_pb2.GenerationChunk) -> Chunk:
        return cls(
            text=pb.text,
            token_ids=tuple(pb.token_ids),
            logprobs=tuple(pb.logprobs),
            finish_reason=FinishReason.from_pb(pb.finish_reason),
            usage=Usage.from_pb(pb.usage) if pb.HasField("usage") else None,
            stop_reason=pb.stop_reason,
            top_logprobs=_per_token(pb),
            index=pb.index,
        )


def _per_token(pb: preprocessor_pb2.GenerationChunk) -> tuple[tuple[tuple[int, float], ...], ...]:
    if not pb.top_token_ids or not pb.token_ids:
        return ()
    k = len(pb.top_token_ids) // len(pb.token_ids)
    pairs = list(zip(pb.top_token_ids, pb.top_logprobs, strict=True))
    return tuple(tuple(pairs[i * k:(i + 1) * k]) for i in range(len(pb.token_ids)))


@dataclass(frozen=True)
class Tokenized:
    token_ids: tuple[int, ...]
    embed_spans: tuple[tuple[int, int], ...]  # (offset, length) per prompt_embeds part
    prompt: str  # rendered template text
    image_token_counts: tuple[int, ...] = ()
