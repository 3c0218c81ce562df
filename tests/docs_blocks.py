"""The README's and docs/'s fenced code blocks, as tests/test_docs.py and tests/integration/test_docs_examples.py
read them. A block preceded by a `<!-- runnable -->` line runs against a live stack; every other one is checked
without running."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str  # "bash", "python", "" ...
    text: str
    runnable: bool

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{doc.name}:{start + 1}: unclosed code block"
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        found.append(Block(doc, start + 1, opened.group(1), "\n".join(body) + "\n", before == RUNNABLE))
        i += 1
    return found


def all_blocks(lang: str) -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if b.lang == lang]


def prose(doc: Path) -> str:
    """The document without its code blocks (links inside code are not links)."""
    return re.sub(r"^```.*?^```\s*$", "", doc.read_text(), flags=re.S | re.M)


def commands(script: str) -> list[list[str]]:
    """The simple commands of a bash block, as argv lists: lines joined at backslash continuations and across
    multi-line quoted strings, comments dropped, split at `;`, `&`, `&&`, `|`, `||` and parentheses, leading
    VAR=value assignments dropped."""
    out, pending = [], ""
    for line in script.splitlines():
        pending += line + "\n"
        if pending.endswith("\\\n"):
            pending = pending[:-2] + " "
            continue
        try:
            lexer = shlex.shlex(pending, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:  # inside a quoted string that goes on on the next line
            continue
        pending = ""
        argv: list[str] = []
        for token in [*tokens, ";"]:
            if token and set(token) <= set(";&|()"):
                while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
                    argv.pop(0)
                if argv:
                    out.append(argv)
                argv = []
            else:
                argv.append(token)
    assert not pending.strip(), f"unterminated command: {pending!r}"
    return out
