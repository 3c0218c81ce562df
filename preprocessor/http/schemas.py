"""Request bodies of the OpenAI-compatible API, in vLLM's shapes (pydantic; validated before the core sees them).

Unknown fields are ignored, as OpenAI's and vLLM's servers do, so tools that send `user` or `metadata`
work. Fields we cannot honour are accepted only at their neutral value (see convert.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from splice.sampling import LOGIT_BIAS_RANGE, MAX_BAD_WORDS, MAX_TOP_LOGPROBS, PENALTY_RANGE, UINT32_MAX


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


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


ContentPart = Annotated[TextPart | ImageUrlPart | PromptEmbedsPart, Field(discriminator="type")]


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class GenerationFields(_Body):
    """Fields both generation endpoints share (OpenAI's and vLLM's extras). Other fields are kept, not dropped:
    convert.UNHONOURED refuses those that ask for a control Splice does not implement."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    # vLLM's extras
    top_k: int | None = None  # -1 or 0 = off
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    request_id: str | None = None
    # penalties and masks (vLLM's; bounds as vllm/sampling_params.py). A null is the field's off value.
    presence_penalty: float | None = Field(None, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    frequency_penalty: float | None = Field(None, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    repetition_penalty: float | None = Field(None, gt=0)
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int | None = Field(None, ge=0, le=UINT32_MAX)
    # token ID (a JSON object's keys are strings: "50256") -> bias; IDs are checked against the engine's table
    logit_bias: dict[int, Annotated[float, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)]] | None = None
    allowed_token_ids: list[int] | None = Field(None, min_length=1)
    bad_words: list[str] | None = Field(None, max_length=MAX_BAD_WORDS)
    include_stop_str_in_output: bool | None = False

class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class CompletionRequest(GenerationFields):
    # text, token IDs, or a one-element list of either (OpenAI's batch form, one prompt only)
    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    prompt_embeds: str | list[str] | None = None  # vLLM: base64 of torch.save(tensor); "safetensors:" + base64
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # the chosen token's and this many most likely
    echo: bool = False
    suffix: str | None = None


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


TokenizeRequest = TokenizeChatRequest | TokenizeCompletionRequest


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
