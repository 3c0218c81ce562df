"""Cheap bounds on a request's size, checked before anything is fetched, decoded, rendered or tokenized: a request
that certainly cannot fit the engine's context (max_model_len) is refused at once with a 400 naming the limit,
instead of after seconds of template and tokenizer work (10 MB of text took 20-31 s of CPU to be found too long).

- Characters of caller text that may reach the prompt (message text and roles, template kwargs' strings, completion
  and Tokenize text): no token covers more characters than the tokenizer's longest vocabulary entry
  (ModelFiles.longest_token; at least MIN_CHARS_PER_TOKEN is allowed, a margin for normalizers that shorten text),
  so more than max_model_len times that cannot fit.
- Messages and content parts: each takes at least one position (a template spends tokens on every message; a part
  is text, an image or embeddings), so more than max_model_len cannot fit. Token IDs: one position each.
- Images (image_embeds parts too) and prompt_embeds parts: their per-request caps (--max-images, --max-embeds-parts)
  and whether the model takes them, counted before an image is fetched (HTTP) or decoded.

Both faces meet these in the core (core.py); the HTTP face also before it fetches remote images (app.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from preprocessor.content import Conversation, Embeds, Image, ImageEmbeds, PromptPart, Text, TokenIds
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles
from preprocessor.normalize import check_counts, kwarg_strings
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo

MIN_CHARS_PER_TOKEN = 32
# A request message (HTTP body, gRPC message) up to this size is decoded on the event loop: at most a few milliseconds,
# less than a thread's hand-off for most. A larger one is parsed and converted in a thread (http/body.py, servicer.py).
INLINE_REQUEST_BYTES = 64 * 1024


def max_chars(info: ModelInfo, files: ModelFiles) -> int:
    return info.max_model_len * max(files.longest_token, MIN_CHARS_PER_TOKEN)


def _check_chars(chars: int, info: ModelInfo, files: ModelFiles, what: str) -> None:
    if chars > max_chars(info, files):
        per = max(files.longest_token, MIN_CHARS_PER_TOKEN)
        raise InvalidArgument(f"{what} is {chars} characters, more than any prompt of the engine's max_model_len "
                              f"{info.max_model_len} holds ({max_chars(info, files)}: this tokenizer's tokens cover "
                              f"at most {files.longest_token} characters each, counted as {per})")


def _check_count(n: int, info: ModelInfo, what: str) -> None:
    if n > info.max_model_len:
        raise InvalidArgument(f"the request has {n} {what}, more than the engine's max_model_len "
                              f"{info.max_model_len}: each takes at least one position of the prompt")


def check_counts_only(messages: int, parts: int, info: ModelInfo) -> None:
    """The message and part counts alone: what a face can check before it builds the conversation."""
    _check_count(messages, info, "messages")
    _check_count(parts, info, "content parts")


def check_conversation(conv: Conversation, info: ModelInfo, files: ModelFiles, limits: Limits) -> None:
    check_counts_only(len(conv.messages), sum(len(m.parts) for m in conv.messages), info)
    images = conv.parts(Image | ImageEmbeds)
    check_counts(len(images), len(conv.parts(Embeds)), info, files, limits, images[0].where if images else "")
    chars = sum(len(m.role) + sum(len(p.text) for p in m.parts if isinstance(p, Text)) for m in conv.messages)
    for key, value in conv.template_kwargs.items():
        chars += len(key) + sum(len(text) for _, text in kwarg_strings(value, f"chat_template_kwargs[{key!r}]"))
    _check_chars(chars, info, files, "the request's text (messages, roles, chat_template_kwargs)")


def check_prompt(parts: Sequence[PromptPart], info: ModelInfo, files: ModelFiles, limits: Limits) -> None:
    _check_count(len(parts), info, "prompt parts")
    ids = sum(len(p.ids) for p in parts if isinstance(p, TokenIds))
    if ids >= info.max_model_len:
        raise InvalidArgument(f"the prompt holds {ids} token IDs; the engine's max_model_len is {info.max_model_len} "
                              f"and at least one position must be left to generate")
    check_counts(0, sum(isinstance(p, Embeds) for p in parts), info, files, limits)
    _check_chars(sum(len(p.text) for p in parts if isinstance(p, Text)), info, files, "the prompt's text")


def check_text(text: str, info: ModelInfo, files: ModelFiles) -> None:
    _check_chars(len(text), info, files, "the text")
