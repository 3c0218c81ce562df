"""What the clients return: plain dataclasses, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass

from splice.v1 import common_pb2, preprocessor_pb2

_FINISH = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length"}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Chunk:
    text: str  # text since the previous chunk
    token_ids: tuple[int, ...]  # tokens since the previous chunk
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None  # "stop" | "length" on the final chunk
    usage: Usage | None = None  # final chunk only
    stop_reason: str = ""  # the stop string that matched, if any

    @classmethod
    def from_pb(cls, pb: preprocessor_pb2.GenerationChunk) -> Chunk:
        finished = pb.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
        return cls(
            text=pb.text,
            token_ids=tuple(pb.token_ids),
            logprobs=tuple(pb.logprobs),
            finish_reason=_FINISH.get(pb.finish_reason) if finished else None,
            usage=Usage(pb.usage.prompt_tokens, pb.usage.completion_tokens) if pb.HasField("usage") else None,
            stop_reason=pb.stop_reason,
        )


@dataclass(frozen=True)
class Tokenized:
    token_ids: tuple[int, ...]
    embed_spans: tuple[tuple[int, int], ...]  # (offset, length) per prompt_embeds part
    prompt: str  # rendered template text
    image_token_counts: tuple[int, ...] = ()
