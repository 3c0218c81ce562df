"""A finished (or streaming) answer as the tool request makes it, vLLM's serving_chat semantics:
- "auto": the parser's calls and the text outside them; finish_reason "tool_calls" when it found any;
- a named function: the whole answer is that function's arguments (content ""; finish_reason as it finished,
  "stop": OpenAI's for a named call);
- "required": the answer is a JSON list of {"name", "parameters"}, each a call (content ""; finish_reason
  "tool_calls" when it stopped; an answer that is not such a list, e.g. cut by max_tokens, stays content);
- parallel_tool_calls false: the first call only.
Streaming: content goes out as it comes until a call may start; from there the text is held, and the calls go
out, each whole in one delta (index, id, type, name, arguments), when the answer finishes. A named function's
arguments stream as they come, after a first delta with its id and name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from preprocessor.outputs import ToolCallDelta
from preprocessor.tools.calls import Extracted, ToolCall
from preprocessor.tools.parsers import ToolParser
from preprocessor.tools.request import ToolRequest
from splice import json_depth

TOOL_CALLS = "tool_calls"


@dataclass(frozen=True)
class Answer:
    content: str | None
    calls: tuple[ToolCall, ...]
    finish_reason: str | None


@dataclass(frozen=True)
class Delta:
    """What one streamed piece of an answer sends: its content (text outside the calls) and its calls' pieces."""

    content: str = ""
    calls: tuple[ToolCallDelta, ...] = ()


# The JSON grammars (xgrammar's, as vLLM's) let a string hold raw control characters, which JSON forbids: a call's
# arguments escape them, so that every client's JSON parser reads them. Between tokens the grammar may write JSON's
# own whitespace (tab, newline, carriage return), which stays: only characters inside strings are escaped, the
# scanner's state carried from one piece of a stream to the next.
_CONTROLS = {c: json.dumps(chr(c))[1:-1] for c in range(0x20)}


class JsonEscaper:
    """A constrained answer's JSON text, piece by piece, with the control characters inside its strings escaped."""

    def __init__(self) -> None:
        self._in_string = False
        self._escaped = False  # the previous character inside a string was a backslash

    def __call__(self, text: str) -> str:
        out = []
        for ch in text:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                elif ch < " ":
                    out.append(_CONTROLS[ord(ch)])
                    continue
            elif ch == '"':
                self._in_string = True
            out.append(ch)
        return "".join(out)


def json_text(text: str) -> str:
    """A whole constrained answer's JSON text with the control characters inside its strings escaped."""
    return JsonEscaper()(text)


def _required(text: str) -> Extracted:
    try:
        items = json_depth.loads(text, strict=False)  # (too deep: not calls, as not JSON)
        calls = tuple(ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items)
    except (ValueError, TypeError, KeyError):
        return Extracted(text)
    return Extracted("", calls) if calls else Extracted(text)


@dataclass
class ToolAnswer:
    """One choice's answer under a tool request (`parser`: the server's, for "auto")."""

    request: ToolRequest
    parser: ToolParser | None = None
    _text: str = ""
    _sent: int = 0  # characters of _text sent as content (streaming)
    _opened: bool = False  # a named call's first delta went out
    _escape: JsonEscaper = field(default_factory=JsonEscaper)  # a named call's arguments, streamed

    def _extract(self, text: str) -> Extracted:
        if self.request.choice == "auto" and self.parser is not None:
            return self.parser.extract(text)
        if self.request.choice == "required":
            return _required(text)
        if self.request.choice == "function":
            return Extracted("", (ToolCall(self.request.name or "", json_text(text)),))
        return Extracted(text)

    def _calls(self, extracted: Extracted) -> tuple[ToolCall, ...]:
        return extracted.calls[:1] if not self.request.parallel else extracted.calls

    def _reason(self, extracted: Extracted, reason: str | None) -> str | None:
        if not extracted.calls:
            return reason
        if self.request.choice == "auto" or (self.request.choice == "required" and reason == "stop"):
            return TOOL_CALLS
        return reason

    def whole(self, text: str, reason: str | None) -> Answer:
        extracted = self._extract(text)
        return Answer(extracted.content, self._calls(extracted), self._reason(extracted, reason))

    def delta(self, text: str, final: bool, reason: str | None) -> tuple[Delta, str | None]:
        """The piece's Delta (nothing yet: empty) and its finish_reason."""
        self._text += text
        if self.request.choice == "function":
            return self._named_delta(text), reason
        if self.request.choice == "none" or (self.request.choice == "auto" and self.parser is None):
            return Delta(text), reason
        content = ""
        if self.request.choice == "auto":
            hold = self.parser.hold_from(self._text) if self.parser is not None else None
            end = len(self._text) if hold is None else max(hold, self._sent)
            if end > self._sent:
                content = self._text[self._sent:end]
                self._sent = end
        if not final:
            return Delta(content), reason
        started = self.request.choice == "required" or (self.parser is not None and self.parser.started(self._text))
        extracted = self._extract(self._text) if started else Extracted(self._text)
        calls = self._calls(extracted)
        if calls:
            content += (extracted.content or "")[self._sent:]
        else:  # held text that was no call after all
            content += self._text[self._sent:]
        self._sent = len(self._text)
        return Delta(content, tuple(ToolCallDelta.whole(i, c) for i, c in enumerate(calls))), \
            self._reason(extracted, reason)

    def _named_delta(self, text: str) -> Delta:
        if not self._opened:
            self._opened = True
            first = ToolCall(self.request.name or "", self._escape(text))
            return Delta(calls=(ToolCallDelta.whole(0, first),))
        return Delta(calls=(ToolCallDelta(0, self._escape(text)),) if text else ())
