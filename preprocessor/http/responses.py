"""GenerationChunks -> OpenAI's JSON: whole responses and SSE chunks of chat.completion / text_completion.

One Shape per endpoint holds what every chunk of a request repeats (id, created, model) and how a
chunk's text and logprobs are spelled there; the stream and the non-streamed body are built from the
same chunks, so their usage is the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from preprocessor.http.logprobs import clamp, completion_logprobs, output_steps, prompt_logprobs_json, prompt_steps
from preprocessor.outputs import GenerationChunk
from preprocessor.tools.answer import ToolAnswer
from preprocessor.tools.parsers import ToolParser
from preprocessor.tools.request import ToolRequest
from splice.engine_output import Usage
from splice.prompt_logprobs import PromptLogprobs

TokenTexts = Callable[[Sequence[int]], list[str]]  # token IDs -> each token's own text (for logprobs)


def usage_json(usage: Usage | None) -> dict | None:
    if usage is None:
        return None
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def total_usage(usages: Mapping[int, Usage | None], n: int = 1) -> Usage | None:
    """A request's usage from its choices' (by choice index, `n` per prompt), as vLLM reports it: each prompt's tokens
    once (its first choice's count), every choice's completion tokens (None when no choice reported one)."""
    known = {i: u for i, u in usages.items() if u is not None}
    if not known:
        return None
    return Usage(sum(u.prompt_tokens for i, u in known.items() if i % n == 0),
                 sum(u.completion_tokens for u in known.values()))


@dataclass
class Collected:
    """One choice's whole answer, joined from its chunks (the non-streamed response)."""

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

    def joined(self) -> GenerationChunk:
        return GenerationChunk("".join(self.text), tuple(self.token_ids), tuple(self.logprobs),
                               finish_reason=self.last.finish_reason if self.last else None,
                               top_ids=tuple(self.top_ids), top_logprobs=tuple(self.top_logprobs),
                               prompt_logprobs=self.prompt_logprobs)


@dataclass
class Shape:
    """A request's choices are numbered as vLLM's: prompt p's choice j (of n) is index p x n + j."""

    request_id: str
    model: str
    token_texts: TokenTexts
    logprobs: bool = False
    include_usage: bool = False  # stream_options.include_usage
    created: int = field(default_factory=lambda: int(time.time()))
    # return_token_ids: each choice's prompt IDs as the engine got them (then each chunk carries its token IDs)
    prompt_ids: Sequence[Sequence[int]] | None = None
    n: int = 1  # choices per prompt
    # logprob_token_ids: each token's alternatives are those tokens (all shown), not the most likely
    listed: bool = False
    # completions `echo`: each prompt's text, which each of its choices' text starts with (and its tokens' logprobs,
    # from the prompt logprobs, start its logprobs); None = no echo. `echo_only`: max_tokens 0, the prompt alone
    echo_prompts: Sequence[str] | None = None
    echo_only: bool = False
    shown: int = 1  # completions: entries of each position's top_logprobs, vLLM's `logprobs` + 1
    _opened: set[int] = field(default_factory=set)  # choices whose first chunk went out (streams)
    _sent: dict[int, int] = field(default_factory=dict)  # choice -> characters of text streamed (text_offset)
    # prompt -> its prompt logprobs: they come on its choice 0 alone (once per prompt from the engine), and each of
    # its choices shows them (completions, vLLM's) or starts its echo with them
    _prompt_logprobs: dict[int, PromptLogprobs] = field(default_factory=dict)
    _prompt_logprobs_json: dict[int, list | None] = field(default_factory=dict)  # prompt -> built once for its choices

    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"
    # What a whole (non-streamed) answer holds per generated token until it is sent: its collected chunks, the
    # response's dict and its JSON, at their peak (measured with tracemalloc: ~80 B of text and ID; logprobs ~800 B
    # more, ~125 B per top_logprobs alternative here, ~550 B in chat's shape, whose entries spell out their bytes).
    TOKEN_BYTES = 128
    LOGPROB_BYTES = 1024
    ALTERNATIVE_BYTES = 160
    # ... and per prompt position with prompt_logprobs = k (measured the same way on completions' JSON): vLLM's
    # prompt_logprobs list, built once per prompt (~560 B + ~330 B per alternative), and each copy of it in the JSON
    # (~220 B + ~210 B per alternative at the peak of rendering it), one per choice that shows it
    PROMPT_POSITION_BYTES = 640
    PROMPT_ALTERNATIVE_BYTES = 352
    PROMPT_COPY_BYTES = 256
    PROMPT_COPY_ALTERNATIVE_BYTES = 224

    @property
    def id(self) -> str:
        return self.id_prefix + self.request_id

    def token_bytes(self, top_logprobs: int) -> int:
        """Bytes a whole answer holds per generated token (the admission charge of one that is not streamed)."""
        return self.TOKEN_BYTES + (self.LOGPROB_BYTES + top_logprobs * self.ALTERNATIVE_BYTES if self.logprobs else 0)

    def prompt_position_bytes(self, k: int, alternatives: int) -> int:
        """Bytes a whole answer holds per prompt position with prompt_logprobs = k: the list, a copy per choice of
        the prompt (vLLM's completions show it on each), and with echo each choice's logprobs of the echoed prompt
        tokens (`alternatives` each)."""
        held = self.PROMPT_POSITION_BYTES + k * self.PROMPT_ALTERNATIVE_BYTES
        held += self.n * (self.PROMPT_COPY_BYTES + k * self.PROMPT_COPY_ALTERNATIVE_BYTES)
        if self.echo_prompts is not None and self.logprobs:
            held += self.n * self.token_bytes(alternatives)
        return held

    @property
    def return_token_ids(self) -> bool:
        return self.prompt_ids is not None

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _note(self, index: int, chunk: GenerationChunk) -> GenerationChunk:
        """`chunk` of choice `index` with its prompt's logprobs, wherever among the prompt's choices they came."""
        prompt = index // self.n
        if chunk.prompt_logprobs is not None:
            self._prompt_logprobs[prompt] = chunk.prompt_logprobs
            return chunk
        known = self._prompt_logprobs.get(prompt)
        return chunk if known is None else replace(chunk, prompt_logprobs=known)

    def response(self, collected: Sequence[Collected]) -> dict:
        for i, c in enumerate(collected):
            if c.prompt_logprobs is not None:
                self._prompt_logprobs[i // self.n] = c.prompt_logprobs
        choices = []
        for i, c in enumerate(collected):
            last = c.last
            choice = self._whole_choice(i, self._note(i, c.joined()))
            choice.update(finish_reason=self._finish_reason(i, last),
                          stop_reason=(last.stop_reason or None) if last else None)
            choices.append(choice)
        body = self._envelope(self.object_name, choices)
        body["usage"] = usage_json(total_usage({i: c.last.usage if c.last else None for i, c in enumerate(collected)},
                                               self.n))
        return body

    def chunk(self, index: int, chunk: GenerationChunk) -> dict | None:
        """The SSE chunk for one GenerationChunk of choice `index`; None when it carries nothing to send."""
        echoing = self.echo_prompts is not None and index not in self._opened
        if chunk.prompt_logprobs is not None:  # (choice 0's first chunk: before its prompt's other choices' first)
            self._prompt_logprobs[index // self.n] = chunk.prompt_logprobs
        if not self._carries_text(index, chunk) and not chunk.final and not (self.logprobs and chunk.logprobs) and \
                not (self.return_token_ids and chunk.token_ids) and not echoing:
            return None
        choice = self._delta_choice(index, self._note(index, chunk) if echoing else chunk)
        choice.update(finish_reason=self._finish_reason(index, chunk),
                      stop_reason=(chunk.stop_reason or None) if chunk.final else None)
        if self.return_token_ids:
            choice["token_ids"] = list(chunk.token_ids)
        first = index not in self._opened
        self._opened.add(index)
        body = self._envelope(self.chunk_object, [choice])
        self._stream_extras(body, index, first)
        if self.include_usage:
            body["usage"] = None
        return body

    def _carries_text(self, index: int, chunk: GenerationChunk) -> bool:
        return bool(chunk.text)

    def _finish_reason(self, index: int, chunk: GenerationChunk | None) -> str | None:
        return _reason(chunk)

    def _stream_extras(self, body: dict, index: int, first: bool) -> None:
        """vLLM's completions put a choice's prompt_token_ids on its first chunk."""
        if first and self.prompt_ids is not None:
            body["choices"][0]["prompt_token_ids"] = list(self.prompt_ids[index // self.n])

    def first_chunks(self) -> list[dict]:
        return []

    def usage_chunk(self, usage: Usage | None) -> dict:
        body = self._envelope(self.chunk_object, [])
        body["usage"] = usage_json(usage)
        return body

    def _tops(self, piece: GenerationChunk) -> list[list[tuple[str, float]]]:
        """Each token's most likely alternatives as (text, logprob), most likely first ([] without top_logprobs)."""
        n = len(piece.token_ids)
        k = len(piece.top_ids) // n if n else 0
        texts = self.token_texts(piece.top_ids) if k else []
        return [list(zip(texts[i * k:(i + 1) * k], piece.top_logprobs[i * k:(i + 1) * k], strict=True))
                for i in range(n)]

    def _text(self, index: int, piece: GenerationChunk, echo: bool) -> str:
        if not echo:
            return piece.text
        prompt = self.echo_prompts[index // self.n]
        return prompt if self.echo_only else prompt + piece.text

    def _logprobs(self, piece: GenerationChunk, echo: bool = False, offset: int = 0) -> dict | None:
        """OpenAI's completions logprobs as vLLM makes them (http/logprobs.py): with `echo`, the prompt's tokens
        first (the first without a logprob), then the generated ones (none with echo_only)."""
        if not self.logprobs:
            return None
        steps = prompt_steps(piece.prompt_logprobs) if echo and piece.prompt_logprobs is not None else []
        if not (echo and self.echo_only):
            steps += output_steps(piece.token_ids, piece.logprobs, piece.top_ids, piece.top_logprobs)
        return completion_logprobs(steps, self.token_texts, None if self.listed else self.shown, offset)

    def _prompt_json(self, index: int, plp: PromptLogprobs | None) -> list | None:
        """vLLM's prompt_logprobs of choice `index`'s prompt, made once and shown on each of its choices."""
        prompt = index // self.n
        if prompt not in self._prompt_logprobs_json:
            self._prompt_logprobs_json[prompt] = prompt_logprobs_json(plp, self.token_texts)
        return self._prompt_logprobs_json[prompt]

    def _whole_choice(self, index: int, whole: GenerationChunk) -> dict:
        echo = self.echo_prompts is not None
        choice = {"index": index, "text": self._text(index, whole, echo), "logprobs": self._logprobs(whole, echo),
                  "prompt_logprobs": self._prompt_json(index, whole.prompt_logprobs)}
        if self.prompt_ids is not None:
            choice.update(prompt_token_ids=list(self.prompt_ids[index // self.n]), token_ids=list(whole.token_ids))
        return choice

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        """With echo, a choice's first chunk starts with the prompt (its text, and its tokens' logprobs) as vLLM's;
        text_offset counts the text streamed before."""
        echo = self.echo_prompts is not None and index not in self._opened
        text = self._text(index, chunk, echo)
        sent = self._sent.get(index, 0)
        self._sent[index] = sent + len(text)
        return {"index": index, "text": text, "logprobs": self._logprobs(chunk, echo, sent)}


@dataclass
class ChatShape(Shape):
    role: str = "assistant"  # vLLM's: the last message's role when no generation prompt is added
    echo: str = ""  # `echo`: the last message's text, which the answer continues
    # a request with tools: each choice's answer goes through a ToolAnswer (preprocessor/tools/answer.py)
    tools: ToolRequest | None = None
    tool_parser: ToolParser | None = None
    _answers: dict[int, ToolAnswer] = field(default_factory=dict)
    _deltas: dict[int, tuple[dict, str | None]] = field(default_factory=dict)  # this chunk's, by choice

    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    ALTERNATIVE_BYTES = 640

    def response(self, collected: Sequence[Collected]) -> dict:
        body = super().response(collected)
        # vLLM's: on the response, not the choice (null when not asked)
        body["prompt_logprobs"] = prompt_logprobs_json(self._prompt_logprobs.get(0), self.token_texts)
        if self.prompt_ids is not None:
            body["prompt_token_ids"] = list(self.prompt_ids[0])
        return body

    def prompt_position_bytes(self, k: int, alternatives: int) -> int:
        """Chat shows the prompt logprobs once, on the response."""
        return self.PROMPT_POSITION_BYTES + k * self.PROMPT_ALTERNATIVE_BYTES + \
            self.PROMPT_COPY_BYTES + k * self.PROMPT_COPY_ALTERNATIVE_BYTES

    def first_chunks(self) -> list[dict]:
        """OpenAI opens every chat stream with the role, one chunk per choice (vLLM: with prompt_token_ids when
        asked); then the echoed text, one chunk per choice."""
        out = []
        for i in range(self.n):
            body = self._envelope(self.chunk_object, [{"index": i, "delta": {"role": self.role, "content": ""},
                                                       "logprobs": None, "finish_reason": None}])
            if self.prompt_ids is not None:
                body["prompt_token_ids"] = list(self.prompt_ids[0])
            out.append(body)
        if self.echo:
            out += [self._envelope(self.chunk_object, [{"index": i, "delta": {"content": self.echo},
                                                        "logprobs": None, "finish_reason": None}])
                    for i in range(self.n)]
        if self.include_usage:
            for b in out:
                b["usage"] = None
        return out

    def _stream_extras(self, body: dict, index: int, first: bool) -> None:
        pass  # the prompt's IDs went out with the role

    def _logprobs(self, piece: GenerationChunk, echo: bool = False, offset: int = 0) -> dict | None:
        """OpenAI's chat logprobs: each token with its `top_logprobs` most likely alternatives, most likely first;
        with logprob_token_ids, vLLM's: the chosen token, then the listed ones (each ID once)."""
        if not self.logprobs:
            return None
        if self.listed:
            steps = output_steps(piece.token_ids, piece.logprobs, piece.top_ids, piece.top_logprobs)
            ids = [i for _, _, items in steps for i, _ in items]
            text = dict(zip(ids, self.token_texts(ids), strict=True))
            tops = [[(text[i], clamp(v)) for i, v in items] for _, _, items in steps]
        else:
            tops = self._tops(piece)
        # (clamped: a structured output's mask leaves -inf alternatives, which JSON cannot hold)
        content = [{"token": t, "logprob": clamp(lp), "bytes": list(t.encode()),
                    "top_logprobs": [{"token": a, "logprob": clamp(alp), "bytes": list(a.encode())}
                                     for a, alp in alts]}
                   for t, lp, alts in zip(self.token_texts(piece.token_ids), piece.logprobs, tops, strict=False)]
        return {"content": content}

    def _answer(self, index: int) -> ToolAnswer:
        if index not in self._answers:
            self._answers[index] = ToolAnswer(self.tools, self.tool_parser)  # type: ignore[arg-type]
        return self._answers[index]

    def _whole_choice(self, index: int, whole: GenerationChunk) -> dict:
        message: dict = {"role": self.role, "content": self.echo + whole.text}
        if self.tools is not None:
            answer = self._answer(index).whole(whole.text, _reason(whole))
            self._deltas[index] = ({}, answer.finish_reason)
            content = answer.content if answer.content is None else self.echo + answer.content
            message.update(content=content, tool_calls=[c.json() for c in answer.calls])
        choice = {"index": index, "message": message, "logprobs": self._logprobs(whole)}
        if self.prompt_ids is not None:
            choice["token_ids"] = list(whole.token_ids)
        return choice

    def _carries_text(self, index: int, chunk: GenerationChunk) -> bool:
        if self.tools is None:
            return bool(chunk.text)
        self._deltas[index] = self._answer(index).delta(chunk.text, chunk.final, _reason(chunk))
        return bool(self._deltas[index][0])

    def _finish_reason(self, index: int, chunk: GenerationChunk | None) -> str | None:
        if self.tools is None or index not in self._deltas:
            return _reason(chunk)
        return self._deltas[index][1]

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        if self.tools is not None:
            return {"index": index, "delta": self._deltas[index][0], "logprobs": self._logprobs(chunk)}
        delta = {"content": chunk.text} if chunk.text else {}
        return {"index": index, "delta": delta, "logprobs": self._logprobs(chunk)}


def _reason(chunk: GenerationChunk | None) -> str | None:
    return chunk.finish_reason.value if chunk is not None and chunk.finish_reason is not None else None
