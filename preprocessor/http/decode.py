"""A generation request's validated body -> what the core takes (conversation or prompts, sampling, what it asks of
its answer: answer.Asked), every check of convert.py done; on the event loop only when the body is small and asks for
nothing costly to check.

Checking tools (each against the JSON Schema metaschema), a structured output's spec (xgrammar) and converting a long
conversation grow with the request: they run in a thread, so that one request cannot hold the loop that serves
every client (the body itself was parsed off the loop when large: body.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from preprocessor.answer import Asked
from preprocessor.content import Conversation, PromptPart
from preprocessor.core import PreprocessorCore
from preprocessor.http import convert
from preprocessor.http.body import INLINE_BODY_BYTES
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest, GenerationFields, TokenizeChatRequest
from preprocessor.request_bounds import check_counts_only
from preprocessor.tools.choice import constrain, constraint_for
from preprocessor.tools.request import ToolRequest
from splice.offload import inline_or_thread
from splice.request_rules import check_max_tokens
from splice.sampling import SamplingParams
from splice.structured_fields import FIELDS as STRUCTURED_FIELDS


@dataclass(frozen=True)
class Chat:
    conv: Conversation  # remote images not fetched yet (media.py, after these checks)
    sampling: SamplingParams
    asked: Asked


@dataclass(frozen=True)
class Completion:
    prompts: list[list[PromptPart]]
    sampling: SamplingParams
    asked: Asked


def _plain(body: GenerationFields, nbytes: int) -> bool:
    """Cheap to check on the loop: a small body without tools or a structured output."""
    return nbytes <= INLINE_BODY_BYTES and not getattr(body, "tools", None) and \
        all(getattr(body, name) is None for name in STRUCTURED_FIELDS)


def conversation(core: PreprocessorCore, body: ChatCompletionRequest | TokenizeChatRequest,
                 tools: ToolRequest | None = None) -> Conversation:
    """The body's conversation, checked against the request bounds (sizes, image count) before any remote image is
    fetched. `tools`: the body's, checked already."""
    # The counts first, from the body: converting 100k messages would take seconds of its own.
    parts = sum(len(m.content) if isinstance(m.content, list) else 1 for m in body.messages)
    check_counts_only(len(body.messages), parts, core.info)
    conv = convert.conversation_from_http(body, tools)
    core.check_conversation(conv)
    return conv


def _chat(core: PreprocessorCore, body: ChatCompletionRequest, lora: str) -> Chat:
    tools = convert.tools_from_http(body, core.limits.tools)
    sampling = constrain(convert.chat_sampling(body), constraint_for(tools))
    convert.check_served(body)
    check_max_tokens(sampling, core.info)  # (before the conversation is converted and its images fetched)
    return Chat(conversation(core, body, tools), sampling, convert.chat_asked(body, lora, tools))


async def decode_chat(core: PreprocessorCore, body: ChatCompletionRequest, nbytes: int, lora: str = "") -> Chat:
    """`nbytes`: the body's size as sent; `lora`: the adapter its `model` names ("" for the base model)."""
    return await inline_or_thread(_plain(body, nbytes), _chat, core, body, lora)


def _completion(body: CompletionRequest, lora: str) -> Completion:
    sampling = convert.completion_sampling(body)
    convert.check_served(body)
    return Completion(convert.prompts_from_http(body), sampling, convert.completion_asked(body, lora))


async def decode_completion(body: CompletionRequest, nbytes: int, lora: str = "") -> Completion:
    return await inline_or_thread(_plain(body, nbytes), _completion, body, lora)
