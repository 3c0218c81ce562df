"""GenerationChunks -> OpenAI's JSON: whole responses and SSE chunks of chat.completion / text_completion.

One Shape per endpoint holds what every chunk of a request repeats (id, created, model) and how a
chunk's text and logprobs are spelled there; the stream and the non-streamed body are built from the
same chunks, so their usage is the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from preprocessor.outputs import GenerationChunk
from splice.engine_output import Usage

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
    last: GenerationChunk | None = None

    def add(self, chunk: GenerationChunk) -> None:
        self.text.append(chunk.text)
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.top_ids += chunk.top_ids
        self.top_logprobs += chunk.top_logprobs
        self.last = chunk

    def joined(self) -> GenerationChunk:
        return GenerationChunk("".join(self.text), tuple(self.token_ids), tuple(self.logprobs),
                               top_ids=tuple(self.top_ids), top_logprobs=tuple(self.top_logprobs))


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
    _opened: set[int] = field(default_factory=set)  # choices whose first chunk went out (streams)

    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"
    # What a whole (non-streamed) answer holds per generated token until it is sent: its collected chunks, the
    # response's dict and its JSON, at their peak (measured with tracemalloc: ~80 B of text and ID; logprobs ~800 B
    # more, ~125 B per top_logprobs alternative here, ~550 B in chat's shape, whose entries spell out their bytes).
    TOKEN_BYTES = 128
    LOGPROB_BYTES = 1024
    ALTERNATIVE_BYTES = 160

    @property
    def id(self) -> str:
        return self.id_prefix + self.request_id

    def token_bytes(self, top_logprobs: int) -> int:
        """Bytes a whole answer holds per generated token (the admission charge of one that is not streamed)."""
        return self.TOKEN_BYTES + (self.LOGPROB_BYTES + top_logprobs * self.ALTERNATIVE_BYTES if self.logprobs else 0)

    @property
    def return_token_ids(self) -> bool:
        return self.prompt_ids is not None

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def response(self, collected: Sequence[Collected]) -> dict:
        choices = []
        for i, c in enumerate(collected):
            last = c.last
            choice = self._whole_choice(i, c.joined())
            choice.update(finish_reason=_reason(last), stop_reason=(last.stop_reason or None) if last else None)
            choices.append(choice)
        body = self._envelope(self.object_name, choices)
        body["usage"] = usage_json(total_usage({i: c.last.usage if c.last else None for i, c in enumerate(collected)},
                                               self.n))
        return body

    def chunk(self, index: int, chunk: GenerationChunk) -> dict | None:
        """The SSE chunk for one GenerationChunk of choice `index`; None when it carries nothing to send."""
        if not chunk.text and not chunk.final and not (self.logprobs and chunk.logprobs) and \
                not (self.return_token_ids and chunk.token_ids):
            return None
        choice = self._delta_choice(index, chunk)
        choice.update(finish_reason=_reason(chunk), stop_reason=(chunk.stop_reason or None) if chunk.final else None)
        if self.return_token_ids:
            choice["token_ids"] = list(chunk.token_ids)
        first = index not in self._opened
        self._opened.add(index)
        body = self._envelope(self.chunk_object, [choice])
        self._stream_extras(body, index, first)
        if self.include_usage:
            body["usage"] = None
        return body

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

    def _logprobs(self, piece: GenerationChunk) -> dict | None:
        """OpenAI's completions logprobs: top_logprobs maps the chosen token and the `logprobs` most likely to their
        logprobs (vLLM's N or N + 1 entries; fewer when tokens share a text, the chosen one's logprob kept)."""
        if not self.logprobs:
            return None
        tokens = self.token_texts(piece.token_ids)
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        tops = [{**dict(alternatives), t: lp}
                for t, lp, alternatives in zip(tokens, piece.logprobs, self._tops(piece), strict=False)]
        return {"tokens": tokens, "token_logprobs": list(piece.logprobs), "top_logprobs": tops, "text_offset": offsets}

    def _whole_choice(self, index: int, whole: GenerationChunk) -> dict:
        choice = {"index": index, "text": whole.text, "logprobs": self._logprobs(whole),
                  "prompt_logprobs": None}  # (vLLM's field; prompt_logprobs are refused, convert.py)
        if self.prompt_ids is not None:
            choice.update(prompt_token_ids=list(self.prompt_ids[index // self.n]), token_ids=list(whole.token_ids))
        return choice

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        return {"index": index, "text": chunk.text, "logprobs": self._logprobs(chunk)}


@dataclass
class ChatShape(Shape):
    role: str = "assistant"  # vLLM's: the last message's role when no generation prompt is added
    echo: str = ""  # `echo`: the last message's text, which the answer continues

    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    ALTERNATIVE_BYTES = 640

    def response(self, collected: Sequence[Collected]) -> dict:
        body = super().response(collected)
        if self.prompt_ids is not None:
            body["prompt_token_ids"] = list(self.prompt_ids[0])
        return body

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

    def _logprobs(self, piece: GenerationChunk) -> dict | None:
        """OpenAI's chat logprobs: each token with its `top_logprobs` most likely alternatives, most likely first."""
        if not self.logprobs:
            return None
        content = [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                    "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in tops]}
                   for t, lp, tops in zip(self.token_texts(piece.token_ids), piece.logprobs, self._tops(piece),
                                          strict=False)]
        return {"content": content}

    def _whole_choice(self, index: int, whole: GenerationChunk) -> dict:
        choice = {"index": index, "message": {"role": self.role, "content": self.echo + whole.text},
                  "logprobs": self._logprobs(whole)}
        if self.prompt_ids is not None:
            choice["token_ids"] = list(whole.token_ids)
        return choice

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        delta = {"content": chunk.text} if chunk.text else {}
        return {"index": index, "delta": delta, "logprobs": self._logprobs(chunk)}


def _reason(chunk: GenerationChunk | None) -> str | None:
    return chunk.finish_reason.value if chunk is not None and chunk.finish_reason is not None else None
