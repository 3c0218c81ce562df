"""Chat template rendering: the model's own (processor or tokenizer) in-process, or a request's override
(only when the operator trusts them) prepared as a job for the sandbox (template_sandbox.py), with kwargs.

Content format follows vLLM's auto-detection: a template that loops over `message['content']` gets
OpenAI-style part lists, any other gets strings. The k-th prompt_embeds part (conversation order)
becomes ONE sentinel string, Sentinels.text(k), so that it is recognized wherever the template moves it;
each image becomes the template's image part (list format) or the processor's placeholder (string
format), so that the processor later finds its own placeholder and expands it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from preprocessor.content import Conversation, Embeds, Image, ImageEmbeds, Text
from preprocessor.sentinel import Sentinels
from splice.errors import FailedPrecondition, InvalidArgument

STRING = "string"
OPENAI = "openai"
# Arguments of apply_chat_template that the caller's kwargs must not replace.
RESERVED_KWARGS = frozenset({"conversation", "messages", "chat_template", "add_generation_prompt", "tokenize",
                             "return_dict", "return_tensors", "tokenizer_kwargs", "return_assistant_tokens_mask",
                             "continue_final_message", "padding", "truncation", "max_length",
                             "sanitize_control_tokens"})


def _is_content(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    return False


def _iterates_content(node: nodes.Node, aliases: set[str]) -> bool:
    while isinstance(node, nodes.Filter) and node.node is not None:  # `message['content'] | list`
        node = node.node
    return _is_content(node) or (isinstance(node, nodes.Name) and node.name in aliases)


def _environment(template: str) -> jinja2.Environment:
    """The environment transformers renders with (it adds extensions such as `{% generation %}`)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template).environment
    except ImportError:  # a transformers without the private helper: plain sandbox, no extensions
        return ImmutableSandboxedEnvironment()
    except jinja2.TemplateSyntaxError:
        return ImmutableSandboxedEnvironment()  # parse() below reports the error


@lru_cache(maxsize=32)
def content_format(template: str) -> str:
    """OPENAI when the template loops over a message's content (or a variable set from it), else STRING."""
    try:
        ast = _environment(template).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidArgument(f"chat template has a syntax error: {exc}") from None
    aliases = {a.target.name for a in ast.find_all(nodes.Assign)
               if isinstance(a.target, nodes.Name) and _is_content(a.node)}
    return OPENAI if any(_iterates_content(f.iter, aliases) for f in ast.find_all(nodes.For)) else STRING


@lru_cache(maxsize=32)
def reads_tools(template: str) -> bool:
    """Whether the template reads a `tools` variable at all: one that does not would drop a request's tools."""
    try:
        ast = _environment(template).parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidArgument(f"chat template has a syntax error: {exc}") from None
    return any(n.name == "tools" and n.ctx == "load" for n in ast.find_all(nodes.Name))


def check_renders_tools(template: str, variables: dict[str, Any]) -> None:
    """Tools for a template that never reads them are refused (vLLM would render the prompt without them)."""
    if variables.get("tools") and not reads_tools(template):
        raise InvalidArgument("tools: this chat template does not render tools (it never reads `tools`); use a "
                              "model or chat_template that does")


def template_messages(conv: Conversation, fmt: str, image_placeholder: str | None, sentinels: Sentinels,
                      ) -> list[dict[str, Any]]:
    """The conversation as the template sees it: the k-th prompt_embeds part -> sentinels.text(k), images (and
    image_embeds) -> image parts."""
    out = []
    embeds = itertools.count()  # the same order as Conversation.parts(Embeds), i.e. the tensors' order
    for msg in conv.messages:
        if fmt == OPENAI:
            content: Any = []
            for p in msg.parts:
                if isinstance(p, Text):
                    content.append({"type": "text", "text": p.text})
                elif isinstance(p, Embeds):
                    content.append({"type": "text", "text": sentinels.text(next(embeds))})
                else:
                    content.append({"type": "image"})
        else:
            pieces: list[str] = []
            prev_text = False
            for p in msg.parts:
                if isinstance(p, Text):
                    # Like vLLM, consecutive text parts are joined by a newline.
                    pieces.append(("\n" if prev_text else "") + p.text)
                elif isinstance(p, Embeds):
                    pieces.append(sentinels.text(next(embeds)))
                elif isinstance(p, Image | ImageEmbeds):  # precomputed features fill an image placeholder too
                    if image_placeholder is None:
                        raise FailedPrecondition(f"{p.where}: this model's processor has no image placeholder")
                    pieces.append(image_placeholder)
                prev_text = isinstance(p, Text)
            content = "".join(pieces)
        out.append({"role": msg.role, "content": content, **msg.fields})
    return out


@dataclass(frozen=True)
class RenderJob:
    """A request template's render, as the sandbox (template_sandbox.py) receives it."""

    template: str
    messages: dict[str, Any]  # content format ("string" / "openai") -> the messages in that format
    add_generation_prompt: bool
    variables: dict[str, Any]  # the tokenizer's special tokens, then the caller's chat_template_kwargs
    continue_final_message: bool = False


TRUST_FLAG = "--trust-request-chat-template"
# chat_template_kwargs keys apply_chat_template would take as a template (or a template's name) rather than as
# a variable: refused like chat_template itself when templates are not trusted (vLLM's CVE: a template placed in
# chat_template_kwargs["chat_template"] bypassed that policy).
TEMPLATE_KWARGS = frozenset({"chat_template"})


def check_template_policy(conv: Conversation, trusted: bool, max_bytes: int) -> None:
    """Request templates are programs this process would run: refused unless the operator trusts them."""
    smuggled = sorted(TEMPLATE_KWARGS & conv.template_kwargs.keys())
    if not trusted and (conv.chat_template is not None or smuggled):
        what = "chat_template" if conv.chat_template is not None else f"chat_template_kwargs{smuggled}"
        raise FailedPrecondition(f"{what}: this server does not accept chat templates in requests; the operator "
                                 f"can allow them with {TRUST_FLAG}")
    if smuggled:
        raise InvalidArgument(f"chat_template_kwargs may not set {smuggled}; send a template as chat_template")
    if conv.chat_template is not None and len(conv.chat_template.encode()) > max_bytes:
        raise InvalidArgument(f"chat_template is {len(conv.chat_template.encode())} bytes; at most {max_bytes}")


def _check_kwargs(conv: Conversation) -> None:
    bad = sorted(RESERVED_KWARGS & conv.template_kwargs.keys())
    if bad:
        raise InvalidArgument(f"chat_template_kwargs may not set {bad}")


def render(tokenizer, template: str | None, conv: Conversation, image_placeholder: str | None,
           sentinels: Sentinels) -> str:
    """The prompt text (sentinels and image placeholders included) from the MODEL's template, in this process.
    A request's template goes to request_job and the sandbox instead."""
    if conv.chat_template is not None:
        raise RuntimeError("a request template renders in the template sandbox, not in-process")
    if not template:
        raise FailedPrecondition("the model has no chat template; pass chat_template or use Complete")
    _check_kwargs(conv)
    check_renders_tools(template, conv.template_kwargs)
    messages = template_messages(conv, content_format(template), image_placeholder, sentinels)
    try:
        prompt = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                               add_generation_prompt=conv.add_generation_prompt,
                                               continue_final_message=conv.continue_final_message,
                                               **conv.template_kwargs)
    except jinja2.TemplateError as exc:
        # Templates signal bad conversations with raise_exception(...), e.g. roles out of order.
        raise InvalidArgument(f"chat template failed: {exc}") from None
    except (ValueError, TypeError) as exc:  # e.g. tools that are not JSON schemas
        raise InvalidArgument(f"chat template failed: {exc}") from None
    if not isinstance(prompt, str):
        raise InvalidArgument("chat template did not render to text")
    return prompt


def request_job(tokenizer, conv: Conversation, image_placeholder: str | None, sentinels: Sentinels) -> RenderJob:
    """What the sandbox needs to render the request's own template as tokenizer.apply_chat_template would.
    Both content formats are prepared: detecting which one the template wants parses it, which is the
    sandbox's job. A format the conversation cannot take carries the reason instead."""
    _check_kwargs(conv)
    messages: dict[str, Any] = {}
    for fmt in (STRING, OPENAI):
        try:
            messages[fmt] = template_messages(conv, fmt, image_placeholder, sentinels)
        except FailedPrecondition as exc:
            messages[fmt] = exc.message
    return RenderJob(conv.chat_template or "", messages, conv.add_generation_prompt,
                     {**tokenizer.special_tokens_map, **conv.template_kwargs}, conv.continue_final_message)
