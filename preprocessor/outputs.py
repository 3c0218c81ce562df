"""What the core streams back: plain dataclasses; protobuf only in their to_pb."""

from __future__ import annotations

from dataclasses import dataclass

from splice.engine_output import FinishReason, Usage, finish_reason_to_pb
from splice.prompt_logprobs import PromptLogprobs, split_messages
from splice.v1 import common_pb2, preprocessor_pb2


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed piece of the answer."""

    text: str  # never ends inside a multi-byte character
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None  # final chunk only; STOP or LENGTH
    usage: Usage | None = None  # final chunk only
    stop_reason: str = ""  # the stop string that ended the output, final chunk only
    # with top_logprobs = k: the k most likely tokens at each step and their logprobs, k per token in token order
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()
    # with SamplingParams.prompt_logprobs: the prompt's, on the first chunk (of choice 0 when n > 1)
    prompt_logprobs: PromptLogprobs | None = None
    index: int = 0  # which of the request's n choices (SamplingParams.n) it belongs to
    # a Chat with tools: call pieces in OpenAI's streamed shape ({"index", "id", "type", "function": {"name",
    # "arguments"}}; later pieces of an index only add arguments), preprocessor/tools/answer.py
    tool_calls: tuple[dict, ...] = ()
    # final chunk only: the token that ended the output when vLLM names it in stop_reason (a stop_token_ids token, a
    # generation-config EOS besides the tokenizer's); preprocessor/stream.py
    stop_token_id: int | None = None

    @property
    def stop_reason_json(self) -> str | int | None:
        """vLLM's stop_reason: the stop string or token that ended the output; None otherwise (an EOS, a length)."""
        return self.stop_reason or self.stop_token_id

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

    def to_pb(self, prompt_logprobs: PromptLogprobs | None = None) -> preprocessor_pb2.GenerationChunk:
        """`prompt_logprobs`: the piece this message carries (to_pbs), default the chunk's own."""
        # built once per chunk on every stream: only the fields that are set (the tuples go in as they are)
        pb = preprocessor_pb2.GenerationChunk(text=self.text, token_ids=self.token_ids, logprobs=self.logprobs,
                                              top_token_ids=self.top_ids, top_logprobs=self.top_logprobs,
                                              index=self.index)
        if self.finish_reason is not None:
            pb.finish_reason = finish_reason_to_pb(self.finish_reason)
        if self.stop_reason:
            pb.stop_reason = self.stop_reason
        if self.stop_token_id is not None:
            pb.stop_token_id = self.stop_token_id
        if self.usage is not None:
            pb.usage.CopyFrom(self.usage.to_pb())
        plp = prompt_logprobs or self.prompt_logprobs
        if plp is not None:
            pb.prompt_logprobs.CopyFrom(plp.to_pb())
        for call in self.tool_calls:
            function = call.get("function", {})
            pb.tool_calls.add(index=call["index"], id=call.get("id", ""), name=function.get("name", ""),
                              arguments=function.get("arguments", ""))
        return pb

    def to_pbs(self) -> list[preprocessor_pb2.GenerationChunk]:
        """This chunk's messages: one, or with a long prompt's logprobs their leading pieces first, each alone
        (splice/prompt_logprobs.py)."""
        return split_messages(self.prompt_logprobs, self.to_pb,
                              lambda piece: preprocessor_pb2.GenerationChunk(prompt_logprobs=piece.to_pb(),
                                                                            index=self.index))


@dataclass(frozen=True)
class TokenizeResult:
    token_ids: tuple[int, ...]  # what the engine would receive
    embed_spans: tuple[tuple[int, int, int], ...]  # (offset, length, tensor_index)
    prompt: str  # rendered template text, sentinels included
    image_token_counts: tuple[int, ...]

    def to_pb(self) -> preprocessor_pb2.TokenizeResponse:
        return preprocessor_pb2.TokenizeResponse(
            token_ids=list(self.token_ids),
            embed_spans=[common_pb2.EmbedSpan(offset=o, length=n, tensor_index=k) for o, n, k in self.embed_spans],
            prompt=self.prompt,
            image_token_counts=list(self.image_token_counts),
        )
