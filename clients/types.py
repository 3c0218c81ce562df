"""What the clients return: plain dataclasses, no protobuf."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from splice.engine_output import FinishReason, Usage
from splice.prompt_logprobs import Pieces, PromptLogprobs
from splice.v1 import preprocessor_pb2


@dataclass(frozen=True)
class ToolCallPiece:
    """A piece of a tool call: the first of an index has its id and name; the arguments of an index's pieces, joined,
    are the call's arguments (a JSON object's text)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Chunk:
    text: str  # text since the previous chunk
    token_ids: tuple[int, ...]  # tokens since the previous chunk
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None  # STOP | LENGTH | TOOL_CALLS on the final chunk (== "stop" ...)
    usage: Usage | None = None  # final chunk only
    stop_reason: str = ""  # the stop string that matched, if any
    # with top_logprobs = k: for each token, the k most likely tokens at its step, (token ID, logprob), most likely
    # first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    # with prompt_logprobs = k (first chunk only): the prompt's token IDs, and per position None at 0, else (token ID,
    # logprob, rank, the k most likely as (token ID, logprob)): `prompt_logprobs.entries()`. With n > 1: on a chunk of
    # choice 0 only
    prompt_logprobs: PromptLogprobs | None = None
    index: int = 0  # which of the request's n choices it belongs to (each ends with its own final chunk)
    # a chat with tools: call pieces as OpenAI streams them; `ToolCallPiece`s of one index join into one call
    tool_calls: tuple[ToolCallPiece, ...] = ()
    # the token that ended the choice when vLLM's stop_reason names it: a stop_token_ids token (its text is not in
    # `text` unless include_stop_str_in_output); None for an EOS, a length, a stop string (`stop_reason`)
    stop_token_id: int | None = None

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
            prompt_logprobs=PromptLogprobs.from_pb(pb.prompt_logprobs) if pb.HasField("prompt_logprobs") else None,
            index=pb.index,
            tool_calls=tuple(ToolCallPiece(c.index, c.id, c.name, c.arguments) for c in pb.tool_calls),
            stop_token_id=pb.stop_token_id if pb.HasField("stop_token_id") else None,
        )


class ChunkReader:
    """GenerationChunk messages -> Chunks, a long prompt's logprobs (sent in pieces, each alone in a message
    before the first token) joined onto the first Chunk."""

    def __init__(self) -> None:
        self._pieces = Pieces()

    def read(self, pb: preprocessor_pb2.GenerationChunk) -> Chunk | None:
        """The Chunk of `pb`, or None for a message that carries only a piece."""
        chunk = Chunk.from_pb(pb)
        if chunk.prompt_logprobs is None:
            return chunk
        self._pieces.add(chunk.prompt_logprobs)
        if not chunk.token_ids and chunk.finish_reason is None:
            return None
        return dataclasses.replace(chunk, prompt_logprobs=self._pieces.take())


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
