"""An answer's events (preprocessor/outputs.py) -> vLLM's JSON: whole responses and SSE chunks of chat.completion /
text_completion, with the keys vLLM's have (its fields Splice has no use for are null, as vLLM's are by default).
Translation only: what the answer holds (its text and tool calls, finish and stop reasons, usage, echo) is the
core's (preprocessor/answer.py).

One Shape per endpoint holds what every chunk of a request repeats (id, created, model) and how a
chunk's text and logprobs are spelled there; the stream and the non-streamed body are built from the
same answer, so their usage is the same numbers. As vLLM's, a streamed chunk holds only the keys vLLM sets in it
(its JSON excludes unset fields): no `usage` key but on the usage chunk, `stop_reason` on a chat choice's final chunk
only, `system_fingerprint` on the last message.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import version

from preprocessor.admission import charge
from preprocessor.answer import Answer
from preprocessor.http.json_body import RawJSON
from preprocessor.http.logprobs import (
    clamp,
    completion_logprobs,
    output_steps,
    prompt_logprobs_json,
    prompt_steps,
    step_strings,
)
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest, GenerationFields
from preprocessor.http.serving import Served
from preprocessor.outputs import Answered, GenerationChunk, ToolCallDelta, WholeAnswer, WholeChoice
from preprocessor.token_strings import CONTEXT, TokenStrings
from splice.engine_output import Usage
from splice.prompt_logprobs import PromptLogprobs

SYSTEM_FINGERPRINT = f"splice-{version('splice')}"
# vLLM's response fields that Splice leaves null, as vLLM does unless asked (KV transfer, per-request metrics)
NULL_FIELDS = {"service_tier": None, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
# ... and a chat message's (OpenAI's refusal, annotations, audio, function_call; vLLM's reasoning)
NULL_MESSAGE_FIELDS = {"refusal": None, "annotations": None, "audio": None, "function_call": None}


def usage_json(usage: Usage | None, details: bool = False, whole: bool = True) -> dict | None:
    """vLLM's usage. `details` (--enable-prompt-tokens-details): prompt_tokens_details.cached_tokens. `whole`: a
    whole response's, whose details are null when not given (a streamed one leaves them out)."""
    if usage is None:
        return None
    out: dict = {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                 "completion_tokens": usage.completion_tokens}
    if whole:
        out.update(prompt_tokens_details=None, completion_tokens_details=None)
    if details:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return out


@dataclass
class Shape:
    """A request's choices are numbered as vLLM's: prompt p's choice j (of n) is index p x n + j."""

    request_id: str
    model: str
    strings: TokenStrings  # how logprobs spell a token (vLLM's rule for pieces of a character; token IDs)
    logprobs: bool = False
    include_usage: bool = False  # stream_options.include_usage
    # stream_options.continuous_usage_stats (with include_usage): every chunk carries its choice's usage so far
    continuous_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    # each prompt's IDs as the engine got them: shown with return_token_ids (then each chunk carries its token IDs),
    # and on a streamed completions echo's first chunk (vLLM's)
    prompt_ids: Sequence[Sequence[int]] = ()
    return_ids: bool = False  # return_token_ids
    n: int = 1  # choices per prompt
    # logprob_token_ids: each token's alternatives are those tokens (all shown), not the most likely
    listed: bool = False
    # completions `echo`: each prompt's text, which each of its choices' text starts with (and its tokens' logprobs,
    # from the prompt logprobs, start its logprobs); None = no echo. `echo_only`: max_tokens 0, the prompt alone
    echo_prompts: Sequence[str] | None = None
    echo_only: bool = False
    shown: int = 1  # completions: entries of each position's top_logprobs, vLLM's `logprobs` + 1
    prompt_details: bool = False  # --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens
    _opened: set[int] = field(default_factory=set)  # choices whose first chunk went out (streams)
    _sent: dict[int, int] = field(default_factory=dict)  # choice -> characters of logprob tokens streamed (text_offset)
    _context: dict[int, list[int]] = field(default_factory=dict)  # choice -> its last chosen tokens (streams)
    _generated: dict[int, int] = field(default_factory=dict)  # choice -> tokens streamed so far (continuous usage)
    # prompt -> its prompt logprobs: they come on its choice 0 alone (once per prompt from the engine), and each of
    # its choices shows them (completions, vLLM's) or starts its echo with them
    _prompt_logprobs: dict[int, PromptLogprobs] = field(default_factory=dict)
    _prompt_logprobs_json: dict[int, RawJSON | None] = field(default_factory=dict)  # prompt -> written once for all

    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"
    # What a whole (non-streamed) answer holds per generated token until it is sent: its collected chunks, the
    # response's dict and its JSON, at their peak (measured with tracemalloc: ~80 B of text and ID; logprobs ~800 B
    # more, ~125 B per top_logprobs alternative here, ~550 B in chat's shape, whose entries spell out their bytes).
    TOKEN_BYTES = 128
    LOGPROB_BYTES = 1024
    ALTERNATIVE_BYTES = 160
    # ... and per prompt position with prompt_logprobs = k (measured the same way on completions' JSON, when the list
    # was built as dicts; written as text now (logprobs.py), it holds ~100 B per alternative, so these bound it from
    # above): vLLM's prompt_logprobs list, built once per prompt (~560 B + ~330 B per alternative), and each copy of
    # it in the JSON (~220 B + ~210 B per alternative at the peak of rendering it), one per choice that shows it
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

    def charge(self, answer: Answer) -> None:
        """A whole answer is held until it is sent: what its choices may hold (n x max_tokens per prompt, and the
        prompt logprobs, shown on each completions choice) is charged to the request's admission before any is
        generated (a streamed one holds only the chunk in flight)."""
        sampling = answer.sampling
        tokens = answer.core.answer_tokens(answer.prepared)
        alternatives = len(sampling.logprob_token_ids) or sampling.top_logprobs  # each token's, with logprobs
        nbytes = tokens * self.token_bytes(alternatives)
        what = f"the whole answer ({answer.choices} choice(s), up to {tokens} tokens together: n x max_tokens"
        if sampling.prompt_logprobs is not None:
            positions = sum(p.request.prompt_len for p in answer.prepared.prompts)
            nbytes += positions * self.prompt_position_bytes(sampling.prompt_logprobs, alternatives)
            what += f"; prompt logprobs of {positions} positions"
        charge(nbytes, what + ")")

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

    def response(self, answer: WholeAnswer) -> dict:
        for i, c in enumerate(answer.choices):
            if c.joined.prompt_logprobs is not None:
                self._prompt_logprobs[i // self.n] = c.joined.prompt_logprobs
        choices = []
        for i, c in enumerate(answer.choices):
            whole = self._note(i, c.joined)
            choice = self._whole_choice(i, whole, c)
            choice.update(finish_reason=_reason(whole), stop_reason=whole.stop_reason_json,
                          token_ids=list(whole.token_ids) if self.return_ids else None)
            choices.append(self._whole_choice_tail(i, choice))
        body = self._envelope(self.object_name, choices)
        body.update(NULL_FIELDS, system_fingerprint=SYSTEM_FINGERPRINT,
                    usage=usage_json(answer.usage, self.prompt_details))
        return body

    def _whole_choice_tail(self, index: int, choice: dict) -> dict:
        """vLLM's completions choice ends with its prompt's logprobs and IDs (null unless asked)."""
        choice["prompt_logprobs"] = choice.pop("prompt_logprobs", None)
        choice["prompt_token_ids"] = list(self.prompt_ids[index // self.n]) if self.return_ids else None
        choice["routed_experts"] = None
        return choice

    def event(self, event: GenerationChunk | Answered) -> dict | None:
        """The SSE chunk of an answer's event; None when it has nothing to send."""
        if isinstance(event, Answered):  # the usage chunk, when asked for
            return self.usage_chunk(event.usage) if self.include_usage else None
        return self.chunk(event)

    def chunk(self, chunk: GenerationChunk) -> dict | None:
        """The SSE chunk of one GenerationChunk (of its choice, chunk.index); None when it carries nothing to send."""
        index = chunk.index
        if self.continuous_usage:  # (counted whether or not this chunk goes out, as vLLM's)
            self._generated[index] = self._generated.get(index, 0) + len(chunk.token_ids)
        echoing = self.echo_prompts is not None and index not in self._opened
        if chunk.prompt_logprobs is not None:  # (choice 0's first chunk: before its prompt's other choices' first)
            self._prompt_logprobs[index // self.n] = chunk.prompt_logprobs
        if not (chunk.text or chunk.tool_calls) and not chunk.final and not (self.logprobs and chunk.logprobs) and \
                not (self.return_ids and chunk.token_ids) and not echoing:
            return None
        choice = self._delta_choice(index, self._note(index, chunk) if echoing else chunk)
        choice["finish_reason"] = _reason(chunk)
        first = index not in self._opened
        self._opened.add(index)
        self._stream_fields(choice, index, chunk, first)
        body = self._envelope(self.chunk_object, [choice])
        if self.continuous_usage:
            body["usage"] = self._usage_so_far(index)
        if chunk.final and not self.include_usage:  # vLLM's: on the last message (the usage chunk, when one follows)
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
        return body

    def _stream_fields(self, choice: dict, index: int, chunk: GenerationChunk, first: bool) -> None:
        """vLLM's completions chunk: its stop_reason, the prompt's IDs (on the choice's first chunk, with
        return_token_ids or echo) and its token IDs (with return_token_ids), else null."""
        shows_prompt = first and (self.return_ids or self.echo_prompts is not None)
        choice["stop_reason"] = chunk.stop_reason_json if chunk.final else None
        choice["prompt_token_ids"] = list(self.prompt_ids[index // self.n]) if shows_prompt else None
        choice["token_ids"] = list(chunk.token_ids) if self.return_ids else None

    def first_chunks(self) -> list[dict]:
        return []

    def _usage_so_far(self, index: int) -> dict:
        """vLLM's usage on a chunk of choice `index` with continuous_usage_stats: its prompt's tokens and its own."""
        prompt, generated = len(self.prompt_ids[index // self.n]), self._generated.get(index, 0)
        return {"prompt_tokens": prompt, "total_tokens": prompt + generated, "completion_tokens": generated}

    def usage_chunk(self, usage: Usage | None) -> dict:
        body = self._envelope(self.chunk_object, [])
        body.update(usage=usage_json(usage, self.prompt_details, whole=False), system_fingerprint=SYSTEM_FINGERPRINT)
        return body

    def _strings(self, index: int, steps: list) -> list[dict[int, str]]:
        """The token strings of choice `index`'s next output steps, after the tokens it was shown before (a whole
        answer: none)."""
        before = self._context.get(index, [])
        strs = step_strings(steps, self.strings, before)
        self._context[index] = [*before, *(t for t, _, _ in steps)][-CONTEXT:]
        return strs

    def _text(self, index: int, piece: GenerationChunk, echo: bool) -> str:
        if not echo:
            return piece.text
        prompt = self.echo_prompts[index // self.n]
        return prompt if self.echo_only else prompt + piece.text

    def _logprobs(self, index: int, piece: GenerationChunk, echo: bool = False) -> dict | None:
        """OpenAI's completions logprobs as vLLM makes them (http/logprobs.py): with `echo`, the prompt's tokens
        first (the first without a logprob), then the generated ones (none with echo_only); text_offset counts the
        token strings streamed before."""
        if not self.logprobs:
            return None
        steps, strs = [], []
        if echo and piece.prompt_logprobs is not None:
            steps = prompt_steps(piece.prompt_logprobs)
            strs = step_strings(steps, self.strings)
        if not (echo and self.echo_only):
            out = output_steps(piece.token_ids, piece.logprobs, piece.top_ids, piece.top_logprobs)
            steps += out
            strs += self._strings(index, out)
        sent = self._sent.get(index, 0)
        logprobs = completion_logprobs(steps, strs, None if self.listed else self.shown, sent)
        self._sent[index] = sent + sum(len(s[t]) for (t, _, _), s in zip(steps, strs, strict=True))
        return logprobs

    def _prompt_json(self, index: int, plp: PromptLogprobs | None) -> RawJSON | None:
        """vLLM's prompt_logprobs of choice `index`'s prompt, made once and shown on each of its choices."""
        prompt = index // self.n
        if prompt not in self._prompt_logprobs_json:
            self._prompt_logprobs_json[prompt] = prompt_logprobs_json(plp, self.strings)
        return self._prompt_logprobs_json[prompt]

    def _whole_choice(self, index: int, whole: GenerationChunk, choice: WholeChoice) -> dict:
        echo = self.echo_prompts is not None
        return {"index": index, "text": self._text(index, whole, echo), "logprobs": self._logprobs(index, whole, echo),
                "prompt_logprobs": self._prompt_json(index, whole.prompt_logprobs)}

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        """With echo, a choice's first chunk starts with the prompt (its text, and its tokens' logprobs) as vLLM's."""
        echo = self.echo_prompts is not None and index not in self._opened
        return {"index": index, "text": self._text(index, chunk, echo), "logprobs": self._logprobs(index, chunk, echo)}


@dataclass
class ChatShape(Shape):
    role: str = "assistant"  # the answer's (answer.py answer_role)
    echo: str = ""  # `echo`: the last message's text, which the answer continues (answer.py echo_text)
    # the answer is read for tool calls (the request has tools) or the server runs a tool parser: vLLM's chunk then
    # has no `content` key when it has no text
    tool_parsing: bool = False

    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    ALTERNATIVE_BYTES = 640

    def response(self, answer: WholeAnswer) -> dict:
        body = super().response(answer)
        # vLLM's: on the response, not the choice (null when not asked)
        body.update(prompt_logprobs=prompt_logprobs_json(self._prompt_logprobs.get(0), self.strings),
                    prompt_token_ids=list(self.prompt_ids[0]) if self.return_ids else None, prompt_text=None)
        return body

    def _whole_choice_tail(self, index: int, choice: dict) -> dict:
        choice["routed_experts"] = None
        return choice

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
            body.update(prompt_token_ids=list(self.prompt_ids[0]) if self.return_ids else None, prompt_text=None)
            out.append(body)
        if self.echo:
            out += [self._envelope(self.chunk_object, [{"index": i, "delta": {"content": self.echo},
                                                        "logprobs": None, "finish_reason": None}])
                    for i in range(self.n)]
        if self.continuous_usage:
            for body in out:
                body["usage"] = self._usage_so_far(body["choices"][0]["index"])
        return out

    def _usage_so_far(self, index: int) -> dict:
        return {**super()._usage_so_far(index), "completion_tokens_details": None}  # (vLLM's chat sets it)

    def _stream_fields(self, choice: dict, index: int, chunk: GenerationChunk, first: bool) -> None:
        """vLLM's chat chunk: stop_reason on a choice's final chunk only; its token IDs (null unless asked). The
        prompt's IDs went out with the role."""
        if chunk.final:
            choice["stop_reason"] = chunk.stop_reason_json
        choice["token_ids"] = list(chunk.token_ids) if self.return_ids else None

    def _logprobs(self, index: int, piece: GenerationChunk, echo: bool = False) -> dict | None:
        """OpenAI's chat logprobs as vLLM's: each token, then the first `top_logprobs` entries of its position's dict
        (the chosen token first: http/logprobs.py); with logprob_token_ids, the chosen token and the listed ones.
        A token's `bytes` spell its decoded text (the chosen one's even with return_tokens_as_token_ids, as vLLM's);
        an alternative's spell its string."""
        if not self.logprobs:
            return None
        k = len(piece.top_ids) // len(piece.token_ids) if piece.token_ids else 0
        steps = output_steps(piece.token_ids, piece.logprobs, piece.top_ids, piece.top_logprobs)
        context = list(self._context.get(index, ()))
        strs = self._strings(index, steps)
        content = []
        for (token, lp, items), text in zip(steps, strs, strict=True):
            shown = items if self.listed else items[:k]
            decoded = self.strings.decoded([token], context)[0] if self.strings.as_ids else text[token]
            # (clamped: a structured output's mask leaves -inf alternatives, which JSON cannot hold)
            content.append({"token": text[token], "logprob": clamp(lp), "bytes": list(decoded.encode()),
                            "top_logprobs": [{"token": text[i], "logprob": clamp(v), "bytes": list(text[i].encode())}
                                             for i, v in shown]})
            context = [*context, token][-CONTEXT:]
        return {"content": content}

    def _whole_choice(self, index: int, whole: GenerationChunk, choice: WholeChoice) -> dict:
        content = None if choice.content is None else self.echo + choice.content
        message: dict = {"role": self.role, "content": content, **NULL_MESSAGE_FIELDS}
        if choice.tool_calls:  # (vLLM's message has no tool_calls key when there are none)
            message["tool_calls"] = [c.json() for c in choice.tool_calls]
        message["reasoning"] = None
        return {"index": index, "message": message, "logprobs": self._logprobs(index, whole)}

    def _delta_choice(self, index: int, chunk: GenerationChunk) -> dict:
        delta: dict = {"content": chunk.text} if chunk.text or not self.tool_parsing else {}
        if chunk.tool_calls:
            delta["tool_calls"] = [_call_json(c) for c in chunk.tool_calls]
        return {"index": index, "delta": delta, "logprobs": self._logprobs(index, chunk)}


def _call_json(call: ToolCallDelta) -> dict:
    """OpenAI's streamed tool call: a call's first piece whole, a later piece its arguments."""
    if call.id:
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, "function": {"arguments": call.arguments}}


def _reason(chunk: GenerationChunk) -> str | None:
    return chunk.finish_reason.value if chunk.finish_reason is not None else None


def _include_usage(body: GenerationFields) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _continuous_usage(body: GenerationFields) -> bool:
    return _include_usage(body) and body.stream_options.continuous_usage_stats


def chat_shape(answer: Answer, body: ChatCompletionRequest, served: Served) -> ChatShape:
    """The JSON of a chat answer, as its body asks for it."""
    listed = bool(answer.sampling.logprob_token_ids)
    return ChatShape(answer.request_id, served.model, served.strings(body.return_tokens_as_token_ids), body.logprobs,
                     _include_usage(body), _continuous_usage(body), prompt_ids=answer.prompt_ids,
                     return_ids=bool(body.return_token_ids), n=answer.n, listed=listed,
                     prompt_details=served.options.prompt_tokens_details, role=answer.role,
                     echo=answer.echo[0] if answer.echo else "",
                     tool_parsing=answer.tools is not None or answer.parser is not None)


def completion_shape(answer: Answer, body: CompletionRequest, served: Served) -> Shape:
    """The JSON of a completions answer, as its body asks for it. With return_token_ids an echo has no text (vLLM's:
    the IDs say it)."""
    echo = None if answer.echo is None else [""] * len(answer.echo) if body.return_token_ids else list(answer.echo)
    return Shape(answer.request_id, served.model, served.strings(body.return_tokens_as_token_ids),
                 answer.sampling.logprobs, _include_usage(body), _continuous_usage(body), prompt_ids=answer.prompt_ids,
                 return_ids=bool(body.return_token_ids), n=answer.n, listed=bool(answer.sampling.logprob_token_ids),
                 prompt_details=served.options.prompt_tokens_details, echo_prompts=echo,
                 echo_only=body.max_tokens == 0, shown=(body.logprobs or 0) + 1)
