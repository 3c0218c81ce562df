"""Tool-call parsers, chosen with --tool-call-parser as in vLLM: each reads calls out of a finished answer
(`extract`, vLLM's extract_tool_calls on the whole text) and says, while an answer streams, from where its text
may be a call and must be held back rather than sent as content (`hold_from`, `started`; answer.py streams a held
call once the answer is finished)."""

from __future__ import annotations

from typing import Protocol

from preprocessor.tools.calls import Extracted


class ToolParser(Protocol):
    name: str

    def extract(self, text: str) -> Extracted:
        """The calls in a finished answer and the text outside them; no calls: the whole text as content."""

    def hold_from(self, text: str) -> int | None:
        """While streaming: where the text that may be (or is) a call starts; None: all of it is content."""

    def started(self, text: str) -> bool:
        """A call's start marker is complete in `text` (so `extract` decides what the held text is)."""


def parser_names() -> list[str]:
    return sorted(_registry())


def get_parser(name: str) -> ToolParser:
    registry = _registry()
    if name not in registry:
        raise ValueError(f"--tool-call-parser must be one of {sorted(registry)}, got {name!r}")
    return registry[name]


def _registry() -> dict[str, ToolParser]:
    from preprocessor.tools.parsers.hermes import HermesParser
    from preprocessor.tools.parsers.llama3_json import Llama3JsonParser
    from preprocessor.tools.parsers.pythonic import PythonicParser

    return {p.name: p for p in (HermesParser(), Llama3JsonParser(), PythonicParser())}


def tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that ends `text` (vLLM's partial_tag_overlap)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def leading_hold(text: str, markers: tuple[str, ...]) -> int | None:
    """hold_from for formats whose calls are the whole answer (vLLM's llama3_json and pythonic streaming): held
    while the answer (past leading whitespace) starts with, or so far is a start of, a marker."""
    body = text.lstrip()
    if not body or any(body.startswith(m) or m.startswith(body) for m in markers):
        return 0
    return None


def leading_started(text: str, markers: tuple[str, ...]) -> bool:
    body = text.lstrip()
    return any(body.startswith(m) for m in markers)
