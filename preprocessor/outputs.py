"""What the core answers with: the typed events of a request's answer (answer.py streams them) and the results of
the other calls. Plain dataclasses: each face translates them, protobuf at the gRPC servicer (encode.py), JSON and
SSE at the HTTP routes (http/responses.py)."""

from __future__ import annotations

from dataclasses import dataclass

from preprocessor.tools.calls import ToolCall
from splice.engine_output import FinishReason, Usage
from splice.prompt_logprobs import PromptLogprobs


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call as it streams: a call's first piece names it (id, name), later pieces of the same index
    add to its arguments (a JSON object's text, whole once joined)."""

    index: int  # which of the answer's calls
    arguments: str = ""
    id: str = ""  # first piece only, "chatcmpl-tool-..."
    name: str = ""  # first piece only

    @classmethod
    def whole(cls, index: int, call: ToolCall) -> ToolCallDelta:
        """A call found whole (at the end of an answer), as one piece."""
        return cls(index, call.arguments, call.id, call.name)


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed piece of one choice's answer."""

    text: str  # never ends inside a multi-byte character; with tools, the content outside the calls
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    finish_reason: FinishReason | None = None  # final chunk only; STOP, LENGTH, or TOOL_CALLS (tools, answer.py)
    usage: Usage | None = None  # final chunk only: the prompt's tokens and this choice's
    stop_reason: str = ""  # the stop string that ended the output, final chunk only
    # with top_logprobs = k: the k most likely tokens at each step and their logprobs, k per token in token order
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()
    # with SamplingParams.prompt_logprobs: the prompt's, on the first chunk (of the prompt's choice 0 when n > 1)
    prompt_logprobs: PromptLogprobs | None = None
    # which of the request's choices it belongs to: prompt p's choice j (of SamplingParams.n) is p x n + j (vLLM's
    # numbering; stream.py numbers one prompt's choices, answer.py the request's)
    index: int = 0
    tool_calls: tuple[ToolCallDelta, ...] = ()  # a Chat with tools: the calls' pieces (preprocessor/tools/answer.py)
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


@dataclass(frozen=True)
class Answered:
    """The end of a request's answer, after every choice's final chunk."""

    # the request's usage, as vLLM counts it: each prompt's tokens once, every choice's completion tokens (None when
    # no choice reported any)
    usage: Usage | None


@dataclass(frozen=True)
class WholeChoice:
    """One choice's answer sent whole (a response that is not streamed)."""

    # all its chunks joined: their text, token IDs and logprobs, the prompt's logprobs, and its last chunk's finish and
    # stop reasons (finish_reason after the tool calls) and usage
    joined: GenerationChunk
    content: str | None  # the text the client reads: with tools, outside the calls (None: the answer is only calls)
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class WholeAnswer:
    choices: tuple[WholeChoice, ...]  # by the request's choice index
    usage: Usage | None  # the request's (Answered.usage)


@dataclass(frozen=True)
class TokenizeResult:
    token_ids: tuple[int, ...]  # what the engine would receive
    embed_spans: tuple[tuple[int, int, int], ...]  # (offset, length, tensor_index)
    prompt: str  # rendered template text, sentinels included
    image_token_counts: tuple[int, ...]
