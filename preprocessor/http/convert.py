"""OpenAI/vLLM request bodies -> the core's dataclasses (content.py, SamplingParams). The HTTP twin of
preprocessor/convert.py: after this, a request is the same whichever face it came through.

Remote (http/https) images are fetched before conversion (media.py); their bytes arrive in `fetched`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
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

Fetched = Mapping[Where, bytes]  # bytes of each remote image part, by its location


def embeds_from_http(data: str, where: Where) -> Embeds:
    if data.startswith(SAFETENSORS_MARKER):
        try:
            blob = base64.b64decode(data[len(SAFETENSORS_MARKER):], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(f"{where}: prompt_embeds after {SAFETENSORS_MARKER!r} is not valid base64: "
                                  f"{exc}") from None
        return Embeds("safetensors", blob, where)
    return Embeds("torch_base64", data, where)


def image_from_http(url: str, where: Where, fetched: Fetched) -> Image:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return Image("url", url, where)
    if scheme in REMOTE_SCHEMES:
        return Image("data", fetched[where], where)
    if scheme == "file":
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidArgument(f"{where}: file: URLs must name a local path (file:///...), got host "
                                  f"{parsed.netloc!r}")
        return Image("path", unquote(parsed.path), where)
    raise InvalidArgument(f"{where}: image_url must be a data:, http(s): or file: URL, got {url[:40]!r}")


def _part(part: object, where: Where, fetched: Fetched) -> Part:
    if isinstance(part, ImageUrlPart):
        return image_from_http(part.image_url.url, where, fetched)
    if isinstance(part, PromptEmbedsPart):
        return embeds_from_http(part.data, where)
    return Text(part.text, where)  # TextPart: the schema's discriminator admits nothing else


def message_from_http(msg: ChatMessage, index: int, fetched: Fetched) -> Message:
    if msg.content is None or isinstance(msg.content, str):
        return Message(msg.role, (Text(msg.content or "", Where(index, 0)),), True, index)
    parts = tuple(_part(p, Where(index, i), fetched) for i, p in enumerate(msg.content))
    return Message(msg.role, parts, False, index)


def remote_images(messages: list[ChatMessage]) -> list[tuple[Where, str]]:
    """The http(s) image URLs of a conversation, with their locations: what media.py must fetch."""
    out = []
    for i, msg in enumerate(messages):
        if isinstance(msg.content, list):
            for k, part in enumerate(msg.content):
                if isinstance(part, ImageUrlPart) and part.image_url.url.split(":", 1)[0].lower() in REMOTE_SCHEMES:
                    out.append((Where(i, k), part.image_url.url))
    return out


def conversation_from_http(body: ChatCompletionRequest | TokenizeChatRequest, fetched: Fetched) -> Conversation:
    return Conversation(
        messages=tuple(message_from_http(m, i, fetched) for i, m in enumerate(body.messages)),
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
    "length_penalty": (1,), "best_of": (1,), "use_beam_search": (False,), "spaces_between_special_tokens": (True,),
    "prompt_logprobs": (), "truncate_prompt_tokens": (),
    "logits_processors": (), "response_format": ({"type": "text"},), "structured_outputs": (), "guided_json": (),
    "guided_regex": (), "guided_choice": (), "guided_grammar": (), "tools": ([],),
    "tool_choice": ("none", "auto"),  # (with no tools, "auto" picks none)
    "functions": ([],), "function_call": ("none", "auto"),
}


def _common(body: GenerationFields, max_tokens: int | None, logprobs: bool, top_logprobs: int) -> SamplingParams:
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
    )


def chat_sampling(body: ChatCompletionRequest) -> SamplingParams:
    if body.top_logprobs and not body.logprobs:
        raise InvalidArgument("top_logprobs needs logprobs: true")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return _common(body, max_tokens, body.logprobs, body.top_logprobs or 0)


def completion_sampling(body: CompletionRequest) -> SamplingParams:
    if body.echo:
        raise InvalidArgument("echo is not supported")
    if body.suffix:
        raise InvalidArgument("suffix is not supported")
    return _common(body, body.max_tokens, body.logprobs is not None, body.logprobs or 0)
