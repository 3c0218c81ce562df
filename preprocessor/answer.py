"""A request's answer: the one pipeline both faces run (docs/architecture.md, "A request in the preprocessor").

prepare_chat / prepare_complete turn a request into an Answer (the core normalizes it; every refusal happens there,
before the engine is contacted); Answer.stream yields its typed events (outputs.py): each choice's chunks as the
engine's outputs come (core.generate), the text of a request with tools read for calls (tools/answer.py), then
Answered with the request's usage. Answer.whole makes the same answer whole, for a response that is not streamed. The
faces only translate these: protobuf at the gRPC servicer (encode.py), JSON and SSE at the HTTP routes
(http/responses.py, http/streaming.py).

What a request means is decided here once, whichever face it came through: what `echo` repeats and the prompt
logprobs it asks for, the answer's role, its tool calls (as it streams, or whole), its usage over n choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from preprocessor.content import Conversation, Embeds, PromptPart, Text, TokenIds
from preprocessor.core import Prepared, PreprocessorCore
from preprocessor.outputs import Answered, GenerationChunk, WholeAnswer, WholeChoice
from preprocessor.tools.answer import ToolAnswer
from preprocessor.tools.parsers import ToolParser
from preprocessor.tools.request import ToolRequest
from splice.engine_output import FinishReason, Usage
from splice.offload import gc_paused, inline_or_thread
from splice.prompt_logprobs import PromptLogprobs
from splice.sampling import SamplingParams

Event = GenerationChunk | Answered
# A whole answer of up to this many tokens (all choices) is joined and read for calls on the event loop: less time
# than a thread's hand-off.
INLINE_WHOLE_TOKENS = 256


@dataclass(frozen=True)
class Asked:
    """What a request asks of its answer besides its prompt and sampling, from either face's fields."""

    request_id: str = ""  # the caller's; "": one is made
    lora: str = ""  # the LoRA adapter it runs under (its name, checked already: loras.py); "": the base model
    tools: ToolRequest | None = None  # a chat's tools: its answer is read for calls as its tool_choice says
    # vLLM's `echo`: the answer starts with the end of the prompt (a chat's last message, when it has the answer's
    # role; a completion's prompt) ...
    echo: bool = False
    # ... and asks for the prompt's logprobs, this many alternatives (vLLM's: chat's top_logprobs, completions'
    # logprobs; None: none), unless the request sets prompt_logprobs itself
    echo_logprobs: int | None = None


def answer_role(conv: Conversation) -> str:
    """vLLM's: the assistant's, or with no generation prompt the last message's (the answer continues it)."""
    if conv.add_generation_prompt or not conv.messages:
        return "assistant"
    return conv.messages[-1].role


def echo_text(conv: Conversation) -> str:
    """What `echo` repeats of a conversation: its last message's text (its text parts joined by newlines, as vLLM's)
    when that message has the answer's role, which the answer then continues; "" otherwise."""
    if not conv.messages or conv.messages[-1].role != answer_role(conv):
        return ""
    return "\n".join(p.text for p in conv.messages[-1].parts if isinstance(p, Text))


def prompt_text(core: PreprocessorCore, prompt: Sequence[PromptPart]) -> str:
    """What `echo` repeats of a completions prompt (vLLM's): a text as sent, token IDs decoded with their special
    tokens."""
    return "".join(p.text if isinstance(p, Text) else core.detokenize(p.ids, False) if isinstance(p, TokenIds)
                   else "" for p in prompt)


def echoed_sampling(sampling: SamplingParams, asked: Asked, embeds: bool) -> SamplingParams:
    """`sampling` with the prompt logprobs `echo` asks for (vLLM's rule), unless the request set prompt_logprobs or
    the prompt has embeddings (they have no tokens to score; asked for explicitly, the core refuses them)."""
    if not asked.echo or asked.echo_logprobs is None or sampling.prompt_logprobs is not None or embeds:
        return sampling
    return dataclasses.replace(sampling, prompt_logprobs=asked.echo_logprobs)


async def prepare_chat(core: PreprocessorCore, conv: Conversation, sampling: SamplingParams,
                       asked: Asked = Asked()) -> Answer:
    """`conv`'s answer, the request normalized and every refusal made (the engine is not contacted yet)."""
    sampling = echoed_sampling(sampling, asked, bool(conv.parts(Embeds)))
    role, echo = answer_role(conv), (echo_text(conv),) if asked.echo else None
    return Answer(core, await core.prepare_chat(conv, sampling, asked.request_id, asked.lora), asked.tools, role,
                  echo)


async def prepare_complete(core: PreprocessorCore, prompts: Sequence[Sequence[PromptPart]], sampling: SamplingParams,
                           asked: Asked = Asked(), add_special_tokens: bool = True) -> Answer:
    """The answer to one prompt or a batch of them (each its own engine request: core.prepare_complete)."""
    sampling = echoed_sampling(sampling, asked, False)  # (echo with embeddings is refused by the face)
    prepared = await core.prepare_complete(prompts, sampling, asked.request_id, add_special_tokens, asked.lora)
    # (after preparing: the prompts' token IDs are valid, so they decode)
    return Answer(core, prepared, echo=tuple(prompt_text(core, p) for p in prompts) if asked.echo else None)


async def chat(core: PreprocessorCore, conv: Conversation, sampling: SamplingParams,
               asked: Asked = Asked()) -> AsyncIterator[Event]:
    """One conversation's answer as it streams (the gRPC Chat's): prepared, then its events."""
    answer = await prepare_chat(core, conv, sampling, asked)
    # aclosing: closing this stream must close the inner ones now (down to the engine call), not at GC.
    async with aclosing(answer.stream()) as events:
        async for event in events:
            yield event


async def complete(core: PreprocessorCore, prompt: Sequence[PromptPart], sampling: SamplingParams,
                   asked: Asked = Asked(), add_special_tokens: bool = True) -> AsyncIterator[Event]:
    """One prompt's answer as it streams (the gRPC Complete's)."""
    answer = await prepare_complete(core, [prompt], sampling, asked, add_special_tokens)
    async with aclosing(answer.stream()) as events:
        async for event in events:
            yield event


class Answer:
    """A prepared request's answer: streamed (stream) or whole (whole)."""

    def __init__(self, core: PreprocessorCore, prepared: Prepared, tools: ToolRequest | None = None,
                 role: str = "assistant", echo: tuple[str, ...] | None = None) -> None:
        self.core = core
        self.prepared = prepared
        self.tools = tools
        self.parser: ToolParser | None = core.tool_parser  # the server's, for tool_choice "auto"
        self.role = role  # a chat answer's role (answer_role)
        self.echo = echo  # with `echo`: by prompt, the text each of its choices starts with (echo_text, prompt_text)

    @property
    def request_id(self) -> str:
        return self.prepared.request_id

    @property
    def sampling(self) -> SamplingParams:
        """The request's sampling as the engine runs it (the same for each of its prompts)."""
        return self.prepared.prompts[0].request.sampling

    @property
    def n(self) -> int:
        """Choices per prompt: prompt p's choice j is the request's choice p x n + j."""
        return self.prepared.choices_per_prompt

    @property
    def choices(self) -> int:
        return self.prepared.choices

    @property
    def prompt_ids(self) -> list[list[int]]:
        return self.prepared.prompt_ids

    def stream(self) -> AsyncIterator[Event]:
        return answer_events(self.core.generate(self.prepared), self.n, self.tools, self.parser)

    async def whole(self) -> WholeAnswer:
        """The answer whole: each choice's chunks joined as they come, then read for tool calls (from all of each
        choice's text: in a thread when the answer is large, as nothing that grows with a request runs on the loop)."""
        collected = [Collected() for _ in range(self.choices)]
        async with aclosing(self.core.generate(self.prepared)) as chunks:
            async for i, chunk in chunks:
                collected[i].add(chunk)
        small = sum(len(c.token_ids) for c in collected) <= INLINE_WHOLE_TOKENS and \
            not any(c.prompt_logprobs for c in collected)
        return await inline_or_thread(small, whole_answer, collected, self.n, self.tools, self.parser)


async def answer_events(chunks: AsyncIterator[tuple[int, GenerationChunk]], n: int, tools: ToolRequest | None = None,
                        parser: ToolParser | None = None) -> AsyncIterator[Event]:
    """The events of an answer from the core's (choice index, chunk) stream: each chunk numbered as the request's
    choice, read for tool calls when the request has tools (each choice's text on its own: their chunks
    interleave), then Answered with the request's usage."""
    answers: dict[int, ToolAnswer] = {}
    usages: dict[int, Usage] = {}
    async with aclosing(chunks):  # closed with this one: a cancel reaches the engine call
        async for index, chunk in chunks:
            if chunk.index != index:
                chunk = dataclasses.replace(chunk, index=index)
            if tools is not None:
                chunk = _with_calls(answers.setdefault(index, ToolAnswer(tools, parser)), chunk)
            if chunk.usage is not None:
                usages[index] = chunk.usage
            yield chunk
    yield Answered(total_usage(usages, n))


def _with_calls(answer: ToolAnswer, chunk: GenerationChunk) -> GenerationChunk:
    """`chunk` as its tool answer streams it: the content it may send, the calls (on the final chunk, or a named
    function's as they come), the finish reason the calls make."""
    delta, reason = answer.delta(chunk.text, chunk.final, _reason(chunk))
    return dataclasses.replace(chunk, text=delta.content, tool_calls=delta.calls,
                               finish_reason=FinishReason(reason) if reason is not None else None)


def total_usage(usages: dict[int, Usage | None], n: int = 1) -> Usage | None:
    """A request's usage from its choices' (by choice index, `n` per prompt), as vLLM reports it: each prompt's tokens
    once (its first choice's count), every choice's completion tokens (None when no choice reported one)."""
    known = {i: u for i, u in usages.items() if u is not None}
    if not known:
        return None
    first = [u for i, u in known.items() if i % n == 0]
    return Usage(sum(u.prompt_tokens for u in first), sum(u.completion_tokens for u in known.values()),
                 sum(u.cached_tokens for u in first))


@dataclass
class Collected:
    """One choice's chunks, joined as they come (an answer sent whole)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)
    prompt_logprobs: PromptLogprobs | None = None
    last: GenerationChunk | None = None

    def add(self, chunk: GenerationChunk) -> None:
        self.text.append(chunk.text)
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.top_ids += chunk.top_ids
        self.top_logprobs += chunk.top_logprobs
        self.prompt_logprobs = self.prompt_logprobs or chunk.prompt_logprobs
        self.last = chunk

    def joined(self, index: int) -> GenerationChunk:
        """The chunks as one: their text, tokens and logprobs, the prompt's logprobs, the last one's end."""
        last = self.last or GenerationChunk("", ())
        return GenerationChunk("".join(self.text), tuple(self.token_ids), tuple(self.logprobs), last.finish_reason,
                               last.usage, last.stop_reason, tuple(self.top_ids), tuple(self.top_logprobs),
                               self.prompt_logprobs, index, stop_token_id=last.stop_token_id)


def whole_answer(collected: Sequence[Collected], n: int = 1, tools: ToolRequest | None = None,
                 parser: ToolParser | None = None) -> WholeAnswer:
    """The collected choices whole (by choice index, `n` per prompt), read for tool calls when the request has tools,
    with the request's usage."""
    with gc_paused():  # (a long answer's join and parse make many objects; full collections would hold the GIL)
        return WholeAnswer(tuple(_whole_choice(c.joined(i), tools, parser) for i, c in enumerate(collected)),
                           total_usage({i: c.last.usage if c.last else None for i, c in enumerate(collected)}, n))


def _whole_choice(joined: GenerationChunk, tools: ToolRequest | None, parser: ToolParser | None) -> WholeChoice:
    if tools is None:
        return WholeChoice(joined, joined.text)
    answer = ToolAnswer(tools, parser).whole(joined.text, _reason(joined))
    reason = FinishReason(answer.finish_reason) if answer.finish_reason is not None else None
    return WholeChoice(dataclasses.replace(joined, finish_reason=reason), answer.content, answer.calls)


def _reason(chunk: GenerationChunk) -> str | None:
    return chunk.finish_reason.value if chunk.finish_reason is not None else None

