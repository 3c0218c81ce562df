"""GenerationChunks -> OpenAI's JSON: whole responses and SSE chunks of chat.completion / text_completion.

One Shape per endpoint holds what every chunk of a request repeats (id, created, model) and how a
chunk's text and logprobs are spelled there; the stream and the non-streamed body are built from the
same chunks, so their usage is the same numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from preprocessor.outputs import GenerationChunk
from splice.engine_output import Usage

TokenTexts = Callable[[Sequence[int]], list[str]]  # token IDs -> each token's own text (for logprobs)


def usage_json(usage: Usage | None) -> dict | None:
    if usage is None:
        return None
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


@dataclass
class Collected:
    """A whole answer, joined from its chunks (the non-streamed response)."""

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
    request_id: str
    model: str
    token_texts: TokenTexts
    logprobs: bool = False
    include_usage: bool = False  # stream_options.include_usage
    created: int = field(default_factory=lambda: int(time.time()))

    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"

    @property
    def id(self) -> str:
        return self.id_prefix + self.request_id

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def response(self, c: Collected) -> dict:
        last = c.last
        choice = self._whole_choice(c.joined())
        choice.update(finish_reason=_reason(last), stop_reason=(last.stop_reason or None) if last else None)
        body = self._envelope(self.object_name, [choice])
        body["usage"] = usage_json(last.usage if last else None)
        return body

    def chunk(self, chunk: GenerationChunk) -> dict | None:
        """The SSE chunk for one GenerationChunk; None when it carries nothing to send."""
        if not chunk.text and not chunk.final and not (self.logprobs and chunk.logprobs):
            return None
        choice = self._delta_choice(chunk)
        choice.update(finish_reason=_reason(chunk), stop_reason=(chunk.stop_reason or None) if chunk.final else None)
        body = self._envelope(self.chunk_object, [choice])
        if self.include_usage:
            body["usage"] = None
        return body

    def first_chunk(self) -> dict | None:
        return None

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

    def _whole_choice(self, whole: GenerationChunk) -> dict:
        return {"index": 0, "text": whole.text, "logprobs": self._logprobs(whole)}

    def _delta_choice(self, chunk: GenerationChunk) -> dict:
        return {"index": 0, "text": chunk.text, "logprobs": self._logprobs(chunk)}


class ChatShape(Shape):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def first_chunk(self) -> dict | None:
        """OpenAI opens every chat stream with the role."""
        body = self._envelope(self.chunk_object, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}])
        if self.include_usage:
            body["usage"] = None
        return body

    def _logprobs(self, piece: GenerationChunk) -> dict | None:
        """OpenAI's chat logprobs: each token with its `top_logprobs` most likely alternatives, most likely first."""
        if not self.logprobs:
            return None
        content = [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                    "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in tops]}
                   for t, lp, tops in zip(self.token_texts(piece.token_ids), piece.logprobs, self._tops(piece),
                                          strict=False)]
        return {"content": content}

    def _whole_choice(self, whole: GenerationChunk) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": whole.text},
                "logprobs": self._logprobs(whole)}

    def _delta_choice(self, chunk: GenerationChunk) -> dict:
        delta = {"content": chunk.text} if chunk.text else {}
        return {"index": 0, "delta": delta, "logprobs": self._logprobs(chunk)}


def _reason(chunk: GenerationChunk | None) -> str | None:
    return chunk.finish_reason.value if chunk is not None and chunk.finish_reason is not None else None
