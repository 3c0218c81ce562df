"""Request bodies of the OpenAI-compatible API, in vLLM's shapes (pydantic; validated before the core sees them).

Unknown fields are ignored, as OpenAI's and vLLM's servers do, so tools that send `user` or `metadata`
work. Fields we cannot honour are accepted only at their neutral value (see convert.py).

Every integer field has one of the bounded types below, never a bare `int`: JSON integers have no size, and a
value past what the field means (or what its protobuf type holds) must be a 400 naming the field, not an
overflow later (tests/preprocessor/test_http_fields.py walks the schemas for bare ints).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from preprocessor.template_args import REASONING_EFFORTS
from splice.sampling import (
    INT32_MAX,
    INT_RANGES,
    LOGIT_BIAS_RANGE,
    MAX_BAD_WORDS,
    MAX_LOGPROB_TOKEN_IDS,
    PENALTY_RANGE,
    UINT32_MAX,
)


def _in(low: int, high: int) -> Any:
    return Field(ge=low, le=high)


# The sampling fields take their range from SamplingParams (splice/sampling.py), the one place that declares it.
MaxTokens = Annotated[int, _in(*INT_RANGES["max_tokens"])]
Seed = Annotated[int, _in(*INT_RANGES["seed"])]
TopK = Annotated[int, _in(-1, INT_RANGES["top_k"][1])]  # vLLM's -1 = off, as 0
TokenId = Annotated[int, _in(0, INT32_MAX)]  # int32 on the wire; the engine's vocabulary bounds it further
Count = Annotated[int, _in(0, INT32_MAX)]  # n: its exact rule is convert.py's, with a clearer message
TopLogprobs = Annotated[int, _in(*INT_RANGES["top_logprobs"])]
MinTokens = Annotated[int, _in(*INT_RANGES["min_tokens"])]
PromptLogprobsCount = Annotated[int, _in(*INT_RANGES["prompt_logprobs"])]  # vLLM: -1 would be the whole vocabulary,
# more than its max_logprobs (20): refused there too
GeometryInt = Annotated[int, Strict(), _in(0, INT32_MAX)]  # an image_embeds geometry value (JSON true is no 1)
ReasoningEffort = Literal[REASONING_EFFORTS]  # (a tuple subscript: Literal["none", "minimal", ...])


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


# JSON's \ud800 escapes decode to lone surrogates: Python strings, but not text (no UTF-8 encodes them), so a
# tokenizer, a template or a JSON answer echoing them would fail. Any JSON string may hold one: keys, extra fields,
# chat_template_kwargs.
_SURROGATE = re.compile("[\ud800-\udfff]")


def surrogate_free(text: str) -> bool:
    return text.isascii() or not _SURROGATE.search(text)


class ParsedBody(dict):
    """A body parsed by http/body.py, which refused lone surrogates as it read each string: the models' walk of it
    (`_text_only`) is skipped."""


def lone_surrogate(value: Any) -> str | None:
    """Where the first string (in a walk of parsed JSON) holding a lone surrogate is, e.g. "messages[0].content";
    None when there is none. Iterative: JSON nests as deep as its parser allowed. The walk keeps no paths (a body may
    hold 100k messages); the path of a string found is looked up by a second walk."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if not item.isascii() and _SURROGATE.search(item):
                return _path_to(value, item)
        elif kind is dict:
            stack.extend(item)
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
    return None


def _path_to(value: Any, target: str) -> str:
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if item is target:
            return "".join(path).lstrip(".") or "body"
        if isinstance(item, dict):
            for key, inner in item.items():
                name = f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!a}]"
                stack.append((key, (*path, name, " (a key)")))
                stack.append((inner, (*path, name)))
        elif isinstance(item, list):
            stack.extend((inner, (*path, f"[{i}]")) for i, inner in enumerate(item))
    return "body"


class _Request(_Body):
    """A whole request body: its strings are checked for lone surrogates before any field is read."""

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if not isinstance(data, ParsedBody) and (where := lone_surrogate(data)) is not None:
            raise ValueError(f"{where} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape not in a pair), "
                             f"which is not text")
        return data


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    url: str  # data:image/...;base64,..., http(s)://... (allowed domains only), file:/// (allowed dir only)
    detail: str | None = None  # accepted, ignored


class ImageUrlPart(_Body):
    type: Literal["image_url"]
    image_url: ImageUrl


class PromptEmbedsPart(_Body):
    type: Literal["prompt_embeds"]
    # vLLM's encoding: base64 of torch.save(tensor) [n, hidden]; or "safetensors:" + base64 of a
    # safetensors file holding exactly one tensor.
    data: str


class ImageEmbedsPart(_Body):
    type: Literal["image_embeds"]
    # vLLM's: base64 of torch.save(tensor) [rows, hidden] (or [1, rows, hidden]; "safetensors:" + base64 too), or a
    # dict holding it under "image_embeds" beside the model family's geometry (each base64 of torch.save(integer
    # tensor), a JSON integer or a JSON list of them). None (vLLM: a uuid of a cached image) is refused: nothing is
    # cached.
    image_embeds: str | dict[str, str | GeometryInt | list[Any]] | None = None
    uuid: str | None = None  # vLLM's cache key for the item: no effect on what is served


ContentPart = Annotated[TextPart | ImageUrlPart | PromptEmbedsPart | ImageEmbedsPart, Field(discriminator="type")]


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    # an assistant turn's calls (OpenAI's shape; `arguments` a JSON string) and a tool's reply to one: the
    # template gets them (arguments parsed, as vLLM's)
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class StreamOptions(_Body):
    model_config = ConfigDict(extra="allow")  # (kept: any option set asks for a stream)

    include_usage: bool = False
    continuous_usage_stats: bool = False  # (with include_usage) usage on every chunk


class GenerationFields(_Request):
    """Fields both generation endpoints share (OpenAI's and vLLM's extras). Other fields are kept, not dropped:
    convert.UNHONOURED refuses those that ask for a control Splice does not implement."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: MaxTokens | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Count = 1
    # vLLM's extras
    top_k: TopK | None = None  # -1 or 0 = off
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[TokenId] | None = None
    request_id: str | None = None
    # penalties and masks (vLLM's; bounds as vllm/sampling_params.py). A null is the field's off value.
    presence_penalty: float | None = Field(None, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    frequency_penalty: float | None = Field(None, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    repetition_penalty: float | None = Field(None, gt=0)
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: MinTokens | None = None
    # token ID (a JSON object's keys are strings: "50256") -> bias; IDs are checked against the engine's table
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)]] | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    bad_words: list[str] | None = Field(None, max_length=MAX_BAD_WORDS)
    include_stop_str_in_output: bool | None = False
    # prompt logprobs and chosen logprobs (vLLM's; convert.py applies their rules)
    prompt_logprobs: PromptLogprobsCount | None = None  # per prompt position: its token's logprob, rank, k most likely
    logprob_token_ids: list[TokenId] | None = Field(None, min_length=1, max_length=MAX_LOGPROB_TOKEN_IDS)
    # structured outputs (OpenAI's, vLLM's and vLLM's legacy aliases): read, checked and refused when more than one
    # is set by splice/structured_fields.py
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # vLLM's: the prefix cache reuses a prefix only between requests with the same salt (SamplingParams checks it:
    # non-empty, bounded)
    cache_salt: str | None = None
    # vLLM's: logprobs name each token "token_id:N" (None: the server's --return-tokens-as-token-ids)
    return_tokens_as_token_ids: bool | None = None


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None  # needs logprobs
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    # vLLM's chat extras (convert.conversation_from_http): template arguments, tokenization, the answer's shape
    continue_final_message: bool = False
    add_special_tokens: bool = False  # special tokens on top of the template's
    documents: list[dict[str, str]] | None = None  # the template's `documents` (RAG)
    reasoning_effort: ReasoningEffort | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # preprocessor/mm_kwargs.py
    echo: bool = False  # the answer starts with the last message's text when it has the answer's role
    return_token_ids: bool | None = None  # prompt_token_ids on the response, token_ids on each choice
    # tool calling (preprocessor/tools/): OpenAI's tool objects, rendered by the template's `tools`; "none" |
    # "auto" | "required" | {"type": "function", "function": {"name": ...}}; false: the first call only
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(GenerationFields):
    # text, token IDs, or a one-element list of either (OpenAI's batch form, one prompt only)
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] | None = None
    max_tokens: Annotated[int, _in(0, UINT32_MAX)] | None = None  # 0: only with echo (the prompt alone, vLLM's)
    prompt_embeds: str | list[str] | None = None  # vLLM: base64 of torch.save(tensor); "safetensors:" + base64
    logprobs: TopLogprobs | None = None  # the chosen token's and this many most likely
    echo: bool = False
    suffix: str | None = None
    # vLLM's default: text prompts get the tokenizer's special tokens (BOS); token IDs and embeddings never do
    add_special_tokens: bool = True
    return_token_ids: bool | None = None  # prompt_token_ids and token_ids on each choice


class TokenizeCompletionRequest(_Request):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Request):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False
    # as ChatCompletionRequest's
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    reasoning_effort: ReasoningEffort | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None  # rendered as ChatCompletionRequest's


TokenizeRequest = TokenizeChatRequest | TokenizeCompletionRequest


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[TokenId]
