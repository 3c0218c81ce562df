"""Structured outputs on xgrammar (vLLM's default backend): a StructuredOutput's spec -> a grammar, checked or compiled.

Two uses, one translation (vLLM's, vllm/v1/structured_output/backend_xgrammar.py):
- `check` parses the spec into a grammar without a tokenizer (fast: no token masks). The preprocessor calls it on
  every request (off its event loop: xgrammar releases the GIL), so an invalid schema, regex or grammar is a 400
  naming it before any engine time.
- splice/grammar_cache.py compiles it for the engine's tokenizer and vocabulary (the token masks: the costly part).
  Compiled grammars never cross the wire; the engine compiles from the spec it receives.

Before xgrammar sees a spec: JSON text nests within splice/json_depth.py's cap (xgrammar's JSON-schema converter
takes time cubic in the depth), and a JSON schema asks only for what the grammar holds (splice/json_schema_rules.py).

JSON schemas and json_object allow any whitespace JSON does between tokens (xgrammar's default, vLLM's), or none with
StructuredOutput.disable_any_whitespace: "," and ":" as separators (vLLM's disable_any_whitespace).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

import xgrammar as xgr

from splice import json_depth
from splice.errors import InvalidArgument
from splice.json_schema_rules import schema_problem
from splice.structured_output import StructuredOutput

CHECKED_SPECS = 256  # distinct specs whose check is remembered (LRU)
JSON_KINDS = ("json", "choice", "structural_tag")  # kinds whose spec is JSON text
JSON_OBJECT_SCHEMA = '{"type": "object"}'
WHITESPACE_KINDS = ("json", "json_object")  # the JSON grammars: disable_any_whitespace applies to them
# xgrammar's errors start with "[hh:mm:ss] /project/cpp/file.cc:123: "; the caller needs the rest
_XGR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*(Check failed: \(.*?\) is false:\s*)?")


def _message(exc: BaseException) -> str:
    text = _XGR_PREFIX.sub("", str(exc)).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


def choice_grammar(spec: str) -> str:
    """A JSON list of strings -> the EBNF grammar whose root is exactly one of them (vLLM's choice_as_grammar)."""
    try:
        choices = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"structured output choice: not a JSON list of strings: {exc}") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidArgument("structured output choice must be a nonempty list of nonempty strings")
    # a JSON string literal is an EBNF string literal in xgrammar's dialect (the same escapes)
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _structural_tag(spec: str) -> tuple[list[xgr.StructuralTagItem], list[str]] | str:
    """vLLM's structural tag: {"structures": [{"begin", "schema", "end"}], "triggers": [...]}, or xgrammar's own
    format (passed through as text)."""
    try:
        tag = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"structured output structural_tag: not JSON: {exc}") from None
    if not isinstance(tag, dict):
        raise InvalidArgument("structured output structural_tag must be a JSON object")
    if "structures" not in tag:
        return spec
    try:
        for i, s in enumerate(tag["structures"]):
            if (problem := schema_problem(s["schema"])) is not None:
                raise InvalidArgument(f"structured output structural_tag: structures[{i}]: {problem}")
        items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                 for s in tag["structures"]]
        triggers = [str(t) for t in tag["triggers"]]
    except (KeyError, TypeError) as exc:
        raise InvalidArgument(f"structured output structural_tag: each structure needs begin, schema and end, and "
                              f"the tag needs triggers ({exc!r})") from None
    return items, triggers


def check(so: StructuredOutput, where: str = "sampling.structured") -> None:
    """Parses `so` into a grammar (no tokenizer needed); InvalidArgument naming `where` (the request's field), the
    kind and xgrammar's reason. A spec seen lately is not parsed again."""
    problem = _problem(so.kind, so.spec)
    if problem is not None:
        raise InvalidArgument(f"{where}: {problem}")


@functools.lru_cache(maxsize=CHECKED_SPECS)
def _problem(kind: str, spec: str) -> str | None:
    try:
        build(StructuredOutput(kind, spec), None)  # type: ignore[arg-type]
    except InvalidArgument as exc:
        return exc.message
    return None


def _check_schema(spec: str) -> None:
    try:
        schema = json.loads(spec)
    except ValueError:
        return  # (xgrammar says what is wrong with it)
    if (problem := schema_problem(schema)) is not None:
        raise InvalidArgument(f"structured output json: {problem}")


def build(so: StructuredOutput, compiler: xgr.GrammarCompiler | None) -> Any:
    """`so` as an xgrammar Grammar (compiler None) or CompiledGrammar; InvalidArgument when it is not valid."""
    kind, spec = so.kind, so.spec
    if kind in JSON_KINDS:
        json_depth.check_text(spec, f"structured output {kind}", json_depth.MAX_SPEC_DEPTH)
    try:
        if kind in WHITESPACE_KINDS:
            schema = spec if kind == "json" else JSON_OBJECT_SCHEMA
            compact = {"any_whitespace": not so.disable_any_whitespace,
                       "separators": (",", ":") if so.disable_any_whitespace else None}
            if compiler is None:
                grammar = xgr.Grammar.from_json_schema(schema, **compact)
            else:
                grammar = compiler.compile_json_schema(schema, **compact)
            if kind == "json":  # (xgrammar's own refusals first: they say more)
                _check_schema(spec)
            return grammar
        if kind == "regex":
            return xgr.Grammar.from_regex(spec) if compiler is None else compiler.compile_regex(spec)
        if kind in ("grammar", "choice"):
            ebnf = choice_grammar(spec) if kind == "choice" else spec
            return xgr.Grammar.from_ebnf(ebnf) if compiler is None else compiler.compile_grammar(ebnf)
        if kind == "structural_tag":
            tag = _structural_tag(spec)
            args = tag if isinstance(tag, tuple) else (tag,)
            if compiler is None:
                return xgr.Grammar.from_structural_tag(*args)
            return compiler.compile_structural_tag(*args)
    except InvalidArgument:
        raise
    except Exception as exc:  # xgrammar reports a bad spec as RuntimeError / ValueError with its reason
        raise InvalidArgument(f"structured output {kind} is not valid: {_message(exc)}") from None
    raise InvalidArgument(f"structured output kind {kind!r} is not supported")


def spec_key(so: StructuredOutput) -> str:
    return hashlib.sha256(f"{so.kind}\0{so.disable_any_whitespace:d}\0{so.spec}".encode()).hexdigest()
