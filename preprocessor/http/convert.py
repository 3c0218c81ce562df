"""OpenAI/vLLM request bodies -> the core's dataclasses (content.py, SamplingParams). The HTTP twin of
preprocessor/convert.py: after this, a request is the same whichever face it came through.

Remote (http/https) images become Image("url", URL) parts here, unfetched: the conversation is checked against
the request bounds first, then media.py fetches them in its place.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import unquote, urlparse

from preprocessor.answer import Asked
from preprocessor.content import (
    Conversation,
    Embeds,
    Image,
    ImageEmbeds,
    Message,
    Part,
    PromptPart,
    Text,
    TokenIds,
    Where,
)
from preprocessor.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerationFields,
    ImageEmbedsPart,
    ImageUrlPart,
    PromptEmbedsPart,
    TokenizeChatRequest,
)
from preprocessor.template_args import template_arguments
from preprocessor.tools.request import ToolRequest, ToolSettings, checked_tools, message_fields, tool_request
from splice.errors import InvalidArgument
from splice.grammar import check as check_grammar
from splice.request_rules import PROMPT_LOGPROBS_WITH_EMBEDS
from splice.sampling import INT_RANGES, SamplingParams
from splice.structured_fields import FIELDS as STRUCTURED_FIELDS
from splice.structured_fields import structured_from_fields

# A prompt_embeds string with this prefix carries a safetensors file (base64) instead of vLLM's torch.save.
SAFETENSORS_MARKER = "safetensors:"
REMOTE_SCHEMES = ("http", "https")


def embeds_from_http(data: str, where: Where, label: str = "prompt_embeds") -> Embeds:
    if data.startswith(SAFETENSORS_MARKER):
        try:
            blob = base64.b64decode(data[len(SAFETENSORS_MARKER):], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(f"{where}: {label} after {SAFETENSORS_MARKER!r} is not valid base64: "
                                  f"{exc}") from None
        return Embeds("safetensors", blob, where, label)
    return Embeds("torch_base64", data, where, label)


def image_embeds_from_http(part: ImageEmbedsPart, where: Where) -> ImageEmbeds:
    """vLLM's image_embeds part: the rows' string, or a dict of it ("image_embeds") and the geometry."""
    value = part.image_embeds
    if value is None:
        raise InvalidArgument(f"{where}: image_embeds is null; send the image's features (this server keeps no "
                              f"cache for a uuid to name)")
    if isinstance(value, str):
        return ImageEmbeds(embeds_from_http(value, where, "image_embeds"), {}, where)
    rows = value.get("image_embeds")
    if not isinstance(rows, str):
        raise InvalidArgument(f"{where}: an image_embeds dict holds the features as base64 under 'image_embeds', "
                              f"beside the geometry; got keys {sorted(value)[:8]}")
    geometry = {k: v for k, v in value.items() if k != "image_embeds"}
    return ImageEmbeds(embeds_from_http(rows, where, "image_embeds"), geometry, where)


def scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


def image_from_http(url: str, where: Where) -> Image:
    kind = scheme(url)
    if kind == "data" or kind in REMOTE_SCHEMES:  # (remote: fetched by media.py before normalization)
        return Image("url", url, where)
    if kind == "file":
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidArgument(f"{where}: file: URLs must name a local path (file:///...), got host "
                                  f"{parsed.netloc!r}")
        return Image("path", unquote(parsed.path), where)
    raise InvalidArgument(f"{where}: image_url must be a data:, http(s): or file: URL, got {url[:40]!r}")


def _part(part: object, where: Where) -> Part:
    if isinstance(part, ImageUrlPart):
        return image_from_http(part.image_url.url, where)
    if isinstance(part, PromptEmbedsPart):
        return embeds_from_http(part.data, where)
    if isinstance(part, ImageEmbedsPart):
        return image_embeds_from_http(part, where)
    return Text(part.text, where)  # TextPart: the schema's discriminator admits nothing else


def message_from_http(msg: ChatMessage, index: int) -> Message:
    fields = message_fields(msg.tool_calls, msg.tool_call_id, msg.name, index)
    if msg.content is None or isinstance(msg.content, str):
        return Message(msg.role, (Text(msg.content or "", Where(index, 0)),), True, index, fields)
    parts = tuple(_part(p, Where(index, i)) for i, p in enumerate(msg.content))
    return Message(msg.role, parts, False, index, fields)


def conversation_from_http(body: ChatCompletionRequest | TokenizeChatRequest,
                           tools: ToolRequest | None = None) -> Conversation:
    """`tools`: the body's, checked already (tools_from_http); else they are checked here."""
    return Conversation(
        messages=tuple(message_from_http(m, i) for i, m in enumerate(body.messages)),
        add_generation_prompt=body.add_generation_prompt,
        chat_template=body.chat_template,
        template_kwargs=template_arguments(body.chat_template_kwargs, body.documents, body.reasoning_effort,
                                           list(tools.tools) if tools is not None else checked_tools(body.tools)),
        continue_final_message=body.continue_final_message,
        add_special_tokens=body.add_special_tokens,
        mm_processor_kwargs=dict(body.mm_processor_kwargs or {}),
    )


def tools_from_http(body: ChatCompletionRequest, settings: ToolSettings) -> ToolRequest | None:
    return tool_request(body.tools, body.tool_choice, body.parallel_tool_calls, settings)


def prompts_from_http(body: CompletionRequest) -> list[list[PromptPart]]:
    """The request's prompts, one choice each, as vLLM serves them: each prompt_embeds item first, then each
    prompt (text, token IDs, or OpenAI's list of either). An empty text prompt next to embeddings is dropped (the
    openai SDK once required `prompt`, so clients send "")."""
    embeds = [body.prompt_embeds] if isinstance(body.prompt_embeds, str) else list(body.prompt_embeds or [])
    if body.prompt in (None, "") and not embeds:  # vLLM's rule (a prompt of no tokens has nothing to continue)
        raise InvalidArgument("set prompt or prompt_embeds; the prompt is empty and there are no prompt_embeds",
                              param="prompt")
    prompts: list[list[PromptPart]] = [[embeds_from_http(e, Where(None, i, "prompt_embeds"))]
                                       for i, e in enumerate(embeds)]
    prompt = body.prompt
    if isinstance(prompt, str):
        if prompt or not prompts:
            prompts.append([Text(prompt, Where(None, 0))])
    elif prompt and isinstance(prompt[0], int):
        prompts.append([TokenIds(tuple(prompt), Where(None, 0))])
    elif prompt:
        prompts += [[Text(p, Where(None, i)) if isinstance(p, str) else TokenIds(tuple(p), Where(None, i))]
                    for i, p in enumerate(prompt)]
    if not prompts:
        raise InvalidArgument("set prompt or prompt_embeds; the prompt is an empty list", param="prompt")
    return prompts


# Sampling and output controls of OpenAI and vLLM that Splice does not implement: field -> the values (besides
# unset and null) that leave it off. Any other value is refused rather than the request served without it.
# best_of: vLLM 0.33 has no such field (its V1 engine dropped it); best_of = n asks for n candidates and returns all
# of them, which is what n does, so that value is served too (`_off`).
UNHONOURED: dict[str, tuple[Any, ...]] = {
    "length_penalty": (1,), "best_of": (1,), "use_beam_search": (False,), "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "logits_processors": (),
    "functions": ([],), "function_call": ("none", "auto"),  # (OpenAI's deprecated form of tools: send tools)
}


def _off(name: str, body: GenerationFields) -> tuple[Any, ...]:
    return (body.n,) if name == "best_of" else UNHONOURED[name]


# Chat's tool fields, which /v1/completions has no place for (vLLM's CompletionRequest has none): refused there as
# UNHONOURED fields are, at the values that ask for something.
CHAT_ONLY: dict[str, tuple[Any, ...]] = {"tools": ([],), "tool_choice": ("none",), "parallel_tool_calls": ()}


def _refuse(extra: dict[str, Any], fields: dict[str, tuple[Any, ...]], where: str = "") -> None:
    for name, off in fields.items():
        value = extra.get(name)
        if value is not None and value not in off:
            leave = f"leave it {off[0]!r} or unset" if off else "leave it unset"
            raise InvalidArgument(f"{name} is not supported{where}; {leave}, got {value!r}")


def _common(body: GenerationFields, max_tokens: int | None, logprobs: bool, top_logprobs: int,
            **controls: Any) -> SamplingParams:
    """`controls`: SamplingParams fields each endpoint works out itself (prompt_logprobs, logprob_token_ids)."""
    low, high = INT_RANGES["n"]
    if not low <= body.n <= high:
        raise InvalidArgument(f"n must be in [{low}, {high}] (OpenAI's range), got {body.n}")
    _refuse(body.model_extra or {}, {name: _off(name, body) for name in UNHONOURED})
    options = body.stream_options
    if options is not None and not body.stream and (options.model_fields_set or options.model_extra):
        raise InvalidArgument("stream_options can only be set when stream is true (vLLM's rule)")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    asked = structured_from_fields({name: getattr(body, name) for name in STRUCTURED_FIELDS})
    params = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        seed=body.seed,
        max_tokens=max_tokens,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        stop=stop,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        skip_special_tokens=body.skip_special_tokens,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        min_p=body.min_p or 0.0,
        min_tokens=body.min_tokens or 0,
        logit_bias=body.logit_bias or {},
        allowed_token_ids=tuple(body.allowed_token_ids or ()),
        bad_words=tuple(body.bad_words or ()),
        include_stop_str_in_output=bool(body.include_stop_str_in_output),
        structured=asked[1] if asked else None,
        n=body.n,
        cache_salt=body.cache_salt,
        **controls,
    )
    if asked:  # (after SamplingParams' size cap) parsed now, so that a bad spec is a 400 naming its field
        check_grammar(asked[1], asked[0])
    return params


def _check_prompt_logprobs(body: GenerationFields) -> None:
    """vLLM's rule: a streamed answer has no place for them (0 passes: nothing to return)."""
    if body.stream and body.prompt_logprobs:
        raise InvalidArgument("prompt_logprobs are not available when stream is true (vLLM's rule); ask for them "
                              "without streaming")


def chat_sampling(body: ChatCompletionRequest) -> SamplingParams:
    """vLLM's: logprob_token_ids (with logprobs) replace the top_logprobs most likely. (What `echo` asks for is the
    core's: chat_asked.)"""
    if body.top_logprobs and not body.logprobs:
        raise InvalidArgument("top_logprobs needs logprobs: true")
    if body.logprob_token_ids and not body.logprobs:
        raise InvalidArgument("logprob_token_ids needs logprobs: true")
    _check_prompt_logprobs(body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    listed = tuple(body.logprob_token_ids or ())
    return _common(body, max_tokens, body.logprobs, 0 if listed else body.top_logprobs or 0,
                   prompt_logprobs=body.prompt_logprobs, logprob_token_ids=listed)


def chat_asked(body: ChatCompletionRequest, lora: str, tools: ToolRequest | None) -> Asked:
    """What the body asks of its answer besides sampling: `echo` asks for the prompt's logprobs, top_logprobs
    alternatives (vLLM's)."""
    return Asked(body.request_id or "", lora, tools, body.echo, body.top_logprobs or 0)


def completion_asked(body: CompletionRequest, lora: str) -> Asked:
    """`echo` asks for the prompt's logprobs, `logprobs` alternatives (vLLM's: none without logprobs)."""
    return Asked(body.request_id or "", lora, echo=body.echo, echo_logprobs=body.logprobs)


def completion_sampling(body: CompletionRequest) -> SamplingParams:
    """vLLM's: max_tokens 0 only with echo (one token is generated and not returned); logprob_token_ids (with
    logprobs) replace the `logprobs` most likely. (The prompt logprobs `echo` asks for: completion_asked.)"""
    if body.suffix:
        raise InvalidArgument("suffix is not supported")
    _refuse(body.model_extra or {}, CHAT_ONLY, " on /v1/completions (tools are chat's: /v1/chat/completions)")
    embeds = body.prompt_embeds is not None and body.prompt_embeds != []
    if body.echo and embeds:
        raise InvalidArgument("echo is not supported with prompt_embeds (vLLM's rule: they have no text)")
    if body.prompt_logprobs is not None and embeds:
        raise InvalidArgument(PROMPT_LOGPROBS_WITH_EMBEDS)
    if body.logprob_token_ids:
        if body.logprobs is None:
            raise InvalidArgument("logprob_token_ids needs logprobs set")
        if body.echo and body.max_tokens == 0:
            raise InvalidArgument("logprob_token_ids is not supported with echo and max_tokens 0: no token is "
                                  "generated")
    if body.max_tokens == 0 and not body.echo:
        raise InvalidArgument("max_tokens must be at least 1 (0 only with echo), got 0")
    _check_prompt_logprobs(body)
    listed = tuple(body.logprob_token_ids or ())
    return _common(body, 1 if body.max_tokens == 0 else body.max_tokens, body.logprobs is not None,
                   0 if listed else body.logprobs or 0, prompt_logprobs=body.prompt_logprobs, logprob_token_ids=listed)


# vLLM's request fields beyond sampling (UNHONOURED above) that change what is served and that Splice does not
# implement: field -> the values (besides unset and null) that leave it off. Any other value is refused, naming
# the field, rather than the request served without it. Fields with no effect on what is served pass: `user`
# (vLLM ignores it too), `session_id` (routing), and without a reasoning parser `include_reasoning` (vLLM's has no
# effect either). Listed against vLLM's own field lists by
# tests/preprocessor/test_vllm_fields.py.
NOT_SERVED: dict[str, tuple[Any, ...]] = {
    "priority": (0,),
    "thinking_token_budget": (),
    "repetition_detection": (),
    "media_io_kwargs": ({},),
    "truncation_side": (),
    "watermarking": (False,),
    "return_token_offsets": (False,),
    "return_prompt_text": (False,),
    "return_weight_versions": (False,),
    "return_mm_kwargs": (False,),
    "mm_payload": ("tensors",),
    "routed_experts_prompt_start": (0,),
    "kv_transfer_params": (),
    "ec_transfer_params": (),
    "vllm_xargs": ({},),
    "stream_interval": (),
}


def check_served(body: GenerationFields) -> None:
    """Refuses a NOT_SERVED field that asks for something (InvalidArgument naming it)."""
    extra = body.model_extra or {}
    for name, off in NOT_SERVED.items():
        value = extra.get(name)
        if value is not None and value not in off:
            leave = f"leave it {off[0]!r} or unset" if off else "leave it unset"
            raise InvalidArgument(f"{name} is not supported; {leave}, got {value!r}")
