"""The core's answers -> splice.v1 preprocessor replies: the only place that writes their protobuf (convert.py reads
the requests). Translation only: what an answer holds is decided by the core (answer.py)."""

from __future__ import annotations

from preprocessor.outputs import Answered, GenerationChunk, TokenizeResult
from splice.engine_output import finish_reason_to_pb
from splice.prompt_logprobs import PromptLogprobs, split_messages
from splice.v1 import common_pb2, preprocessor_pb2


def chunk_pbs(event: GenerationChunk | Answered) -> list[preprocessor_pb2.GenerationChunk]:
    """An answer's event as GenerationChunk messages: a chunk is one message, or with a long prompt's logprobs their
    leading pieces first, each alone (splice/prompt_logprobs.py); the answer's end is none (each choice's final
    chunk carried its usage)."""
    if isinstance(event, Answered):
        return []
    return split_messages(event.prompt_logprobs, lambda piece: chunk_pb(event, piece),
                          lambda piece: preprocessor_pb2.GenerationChunk(prompt_logprobs=piece.to_pb(),
                                                                        index=event.index))


def chunk_pb(chunk: GenerationChunk, prompt_logprobs: PromptLogprobs | None = None) -> preprocessor_pb2.GenerationChunk:
    """`prompt_logprobs`: the piece this message carries (chunk_pbs), default the chunk's own."""
    # built once per chunk on every stream: only the fields that are set (the tuples go in as they are)
    pb = preprocessor_pb2.GenerationChunk(text=chunk.text, token_ids=chunk.token_ids, logprobs=chunk.logprobs,
                                          top_token_ids=chunk.top_ids, top_logprobs=chunk.top_logprobs,
                                          index=chunk.index)
    if chunk.finish_reason is not None:
        pb.finish_reason = finish_reason_to_pb(chunk.finish_reason)
    if chunk.stop_reason:
        pb.stop_reason = chunk.stop_reason
    if chunk.stop_token_id is not None:
        pb.stop_token_id = chunk.stop_token_id
    if chunk.usage is not None:
        pb.usage.CopyFrom(chunk.usage.to_pb())
    plp = prompt_logprobs or chunk.prompt_logprobs
    if plp is not None:
        pb.prompt_logprobs.CopyFrom(plp.to_pb())
    for call in chunk.tool_calls:
        pb.tool_calls.add(index=call.index, id=call.id, name=call.name, arguments=call.arguments)
    return pb


def tokenize_pb(result: TokenizeResult) -> preprocessor_pb2.TokenizeResponse:
    return preprocessor_pb2.TokenizeResponse(
        token_ids=list(result.token_ids),
        embed_spans=[common_pb2.EmbedSpan(offset=o, length=n, tensor_index=k) for o, n, k in result.embed_spans],
        prompt=result.prompt,
        image_token_counts=list(result.image_token_counts),
    )
