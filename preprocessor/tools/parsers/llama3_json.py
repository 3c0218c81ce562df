"""vLLM's `llama3_json` parser (Llama 3.x's JSON tool calls): the answer holds JSON objects `{"name": ...,
"arguments": {...}}` (or "parameters"), optionally after `<|python_tag|>`, several separated by "; ". Any object
found counts; one without a name, or JSON nested deeper than splice/json_depth.py allows, makes the whole answer
content. With calls there is no content, as vLLM's.
Streaming (as vLLM's): only an answer that starts with `<|python_tag|>` or `{` is held as a call."""

from __future__ import annotations

import json

from preprocessor.tools.calls import Extracted, ToolCall
from preprocessor.tools.parsers import leading_hold, leading_started
from splice.json_depth import MAX_JSON_DEPTH, text_depth

PYTHON_TAG = "<|python_tag|>"
MARKERS = (PYTHON_TAG, "{")


class Llama3JsonParser:
    name = "llama3_json"

    def extract(self, text: str) -> Extracted:
        if PYTHON_TAG not in text and "{" not in text:
            return Extracted(text)
        if text_depth(text) > MAX_JSON_DEPTH:  # (the decoder recurses per level): no call, as for text not JSON
            return Extracted(text)
        decoder = json.JSONDecoder()
        calls = []
        end = -1
        start = text.find("{")
        while start >= 0:
            if start >= end:  # (a brace inside an object already read is part of it)
                try:
                    obj, length = decoder.raw_decode(text[start:])
                except ValueError:
                    return Extracted(text)
                end = start + length
                if not isinstance(obj, dict) or "name" not in obj:
                    return Extracted(text)
                if "arguments" in obj:
                    args = obj["arguments"]
                elif "parameters" in obj:  # Llama writes either
                    args = obj["parameters"]
                else:
                    return Extracted(text)
                calls.append(ToolCall(obj["name"], json.dumps(args, ensure_ascii=False)))
            start = text.find("{", start + 1)
        return Extracted(None, tuple(calls)) if calls else Extracted(text)

    def hold_from(self, text: str) -> int | None:
        return leading_hold(text, MARKERS)

    def started(self, text: str) -> bool:
        return leading_started(text, MARKERS)
