"""vLLM's `hermes` parser: calls are `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5 and
others); the content is the text before the first call. A call cut short (no closing tag) still counts when its
JSON is whole; any call that is not JSON (or nests deeper than splice/json_depth.py allows) makes the whole answer
content, as vLLM's."""

from __future__ import annotations

import json
import re

from preprocessor.tools.calls import Extracted, ToolCall
from preprocessor.tools.parsers import tag_overlap
from splice import json_depth

START = "<tool_call>"
END = "</tool_call>"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class HermesParser:
    name = "hermes"

    def extract(self, text: str) -> Extracted:
        if START not in text:
            return Extracted(text)
        try:
            calls = []
            for closed, open_ in CALL.findall(text):
                obj = json_depth.loads(closed or open_)  # (too deep: not a call, as not JSON)
                calls.append(ToolCall(obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
        except (ValueError, KeyError, TypeError, AttributeError):
            return Extracted(text)
        content = text[:text.find(START)]
        return Extracted(content or None, tuple(calls))

    def hold_from(self, text: str) -> int | None:
        at = text.find(START)
        if at >= 0:
            return at
        k = tag_overlap(text, START)
        return len(text) - k if k else None

    def started(self, text: str) -> bool:
        return START in text
