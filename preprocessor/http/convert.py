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

from preprocessor.content import Conversation, Embeds, Image, Message, Part, PromptPart, Text, TokenIds, Where
from preprocessor.http.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerationFields,
    ImageUrlPart,
    PromptEmbedsPart,
    TokenizeChatRequest,
)
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams

# A prompt_embeds string with this prefix carries a safetensors file (base64) instead of vLLM's torch.save.
SAFETENSORS_MARKER = "safetensors:"
REMOTE_SCHEMES = ("http", "https")


def embeds_from_http(data: str, where: Where) -> Embeds:
    if data.startswith(SAFETENSORS_MARKER):
        try:
            blob = base64.b64decode(data[len(SAFETENSORS_MARKER):], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(f"{where}: prompt_embeds after {SAFETENSORS_MARKER!r} is not valid base64: "
                                  f"{exc}") from None
        return Embeds("safetensors", blob, where)
    return Embeds("torch_base64", data, where)


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
    return Text(part.text, where)  # TextPart: the schema's discriminator admits nothing else


def message_from_http(msg: ChatMessage, index: int) -> Message:
    if msg.content is None or isinstance(msg.content, str):
        return Message(msg.role, (Text(msg.content or "", Where(index, 0)),), True, index)
    parts = tuple(_part(p, Where(index, i)) for i, p in enumerate(msg.content))
    return Message(msg.role, parts, False, index)


def conversation_from_http(body: ChatCompletionRequest | TokenizeChatRequest) -> Conversation:
    return Conversation(
        messages=tuple(message_from_http(m, i) for i, m in enumerate(body.messages)),
        add_generation_prompt=body.add_generation_prompt,
        chat_template=body.chat_template,
        template_kwargs=dict(body.chat_template_kwargs or {}),
    )


def prompt_from_http(body: CompletionRequest) -> list[PromptPart]:
    """prompt_embeds parts first, then the prompt (text or token IDs); an empty text prompt next to
    embeddings is dropped (the openai SDK requires `prompt`, so vLLM's clients send "")."""
    embeds = [body.prompt_embeds] if isinstance(body.prompt_embeds, str) else list(body.prompt_embeds or [])
    parts: list[PromptPart] = [embeds_from_http(e, Where(None, i)) for i, e in enumerate(embeds)]
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise InvalidArgument(f"prompt holds {len(prompt)} prompts; send one prompt per request")
        prompt = prompt[0]
    where = Where(None, len(parts))
    if isinstance(prompt, str):
        if prompt or not parts:
            parts.append(Text(prompt, where))
    elif prompt is not None:
        parts.append(TokenIds(tuple(prompt), where))
    if not parts:
        raise InvalidArgument("set prompt or prompt_embeds")
    return parts


# Sampling and output controls of OpenAI and vLLM that Splice does not implement: field -> the values (besides
# unset and null) that leave it off. Any other value is refused rather than the request served without it.
UNHONOURED: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "min_p": (0,),
    "min_tokens": (0,), "length_penalty": (1,), "best_of": (1,), "use_beam_search": (False,), "logit_bias": ({},),
    "bad_words": ([],), "allowed_token_ids": (), "include_stop_str_in_output": (False,),
    "spaces_between_special_tokens": (True,), "prompt_logprobs": (), "truncate_prompt_tokens": (),
    "logits_processors": (), "response_format": ({"type": "text"},), "structured_outputs": (), "guided_json": (),
    "guided_regex": (), "guided_choice": (), "guided_grammar": (), "tools": ([],),
    "tool_choice": ("none", "auto"),  # (with no tools, "auto" picks none)
    "functions": ([],), "function_call": ("none", "auto"),
}


def _common(body: GenerationFields, max_tokens: int | None, logprobs: bool) -> SamplingParams:
    if body.n != 1:
        raise InvalidArgument(f"n must be 1 (one choice per request), got {body.n}")
    for name, off in UNHONOURED.items():
        value = (body.model_extra or {}).get(name)
        if value is not None and value not in off:
            leave = f"leave it {off[0]!r} or unset" if off else "leave it unset"
            raise InvalidArgument(f"{name} is not supported; {leave}, got {value!r}")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if body.top_k in (None, -1) else body.top_k,
        seed=body.seed,
        max_tokens=max_tokens,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        stop=stop,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        skip_special_tokens=body.skip_special_tokens,
    )


def chat_sampling(body: ChatCompletionRequest) -> SamplingParams:
    if body.top_logprobs:
        raise InvalidArgument(f"top_logprobs must be 0: only the chosen token's logprob is reported, got "
                              f"{body.top_logprobs}")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _common(body, max_tokens, body.logprobs)


def completion_sampling(body: CompletionRequest) -> SamplingParams:
    if body.echo:
        raise InvalidArgument("echo is not supported")
    if body.suffix:
        raise InvalidArgument("suffix is not supported")
    if body.logprobs is not None and not 0 <= body.logprobs <= 1:
        raise InvalidArgument(f"logprobs must be 0 or 1: only the chosen token's logprob is reported, got "
                              f"{body.logprobs}")
    return _common(body, body.max_tokens, body.logprobs is not None)
