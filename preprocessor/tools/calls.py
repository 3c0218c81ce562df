"""A tool call found in an answer, as OpenAI's `message.tool_calls` spells it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def new_call_id() -> str:
    """vLLM's make_tool_call_id: "chatcmpl-tool-" and a random UUID's hex."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's `function.arguments`
    id: str = field(default_factory=new_call_id)

    def json(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Extracted:
    """A finished answer split as vLLM's parsers split it: the text outside the calls (None: none), the calls."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()
