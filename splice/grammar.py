"""Structured outputs on xgrammar (vLLM's default backend): a StructuredOutput's spec -> a grammar, checked or compiled.

Two uses, one translation (vLLM's, vllm/v1/structured_output/backend_xgrammar.py):
- `check` parses the spec into a grammar without a tokenizer (fast: no token masks). The preprocessor calls it on
  every request, so an invalid schema, regex or grammar is a 400 naming it before any engine time.
- `GrammarCache` compiles it for the engine's tokenizer and vocabulary (the token masks: the costly part), in its own
  thread and once per distinct spec (keyed by the spec's hash), with a time bound. Compiled grammars never cross
  the wire; the engine compiles from the spec it receives.

JSON schemas and json_object allow any whitespace JSON does between tokens (xgrammar's default, vLLM's), or none with
StructuredOutput.disable_any_whitespace: "," and ":" as separators (vLLM's disable_any_whitespace).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import xgrammar as xgr

from splice.errors import InvalidArgument
from splice.sampling import DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S
from splice.structured_output import StructuredOutput

CACHE_ENTRIES = 256  # distinct specs kept compiled (LRU)
JSON_OBJECT_SCHEMA = '{"type": "object"}'
JSON_KINDS = ("json", "json_object")  # the grammars disable_any_whitespace applies to
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


@functools.lru_cache(maxsize=CACHE_ENTRIES)
def _problem(kind: str, spec: str) -> str | None:
    try:
        _build(StructuredOutput(kind, spec), None)  # type: ignore[arg-type]
    except InvalidArgument as exc:
        return exc.message
    return None


def _build(so: StructuredOutput, compiler: xgr.GrammarCompiler | None) -> Any:
    """`so` as an xgrammar Grammar (compiler None) or CompiledGrammar; InvalidArgument when it is not valid."""
    kind, spec = so.kind, so.spec
    try:
        if kind in JSON_KINDS:
            schema = spec if kind == "json" else JSON_OBJECT_SCHEMA
            compact = {"any_whitespace": not so.disable_any_whitespace,
                       "separators": (",", ":") if so.disable_any_whitespace else None}
            if compiler is None:
                return xgr.Grammar.from_json_schema(schema, **compact)
            return compiler.compile_json_schema(schema, **compact)
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


class GrammarCache:
    """Compiled grammars for one tokenizer, by the spec's hash. `compile` runs in this cache's thread, never the
    caller's; concurrent requests for one spec share its compile. A compile that outlasts `timeout_s` fails its
    waiters with InvalidArgument (xgrammar cannot stop it: it finishes in the background and is kept). `tokenizer`
    loads the HF tokenizer, in the compile thread at the first compile."""

    def __init__(self, tokenizer: Callable[[], Any], vocab_size: int, stop_token_ids: tuple[int, ...] = (),
                 timeout_s: float = DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S, entries: int = CACHE_ENTRIES) -> None:
        self._tokenizer, self._vocab_size, self._stops = tokenizer, vocab_size, list(stop_token_ids) or None
        self.timeout_s = timeout_s
        self._entries = entries
        self._compiler: xgr.GrammarCompiler | None = None  # made in the compile thread (reads the whole vocabulary)
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="splice-grammar")

    def _compile(self, so: StructuredOutput) -> xgr.CompiledGrammar:
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer(), vocab_size=self._vocab_size,
                                                      stop_token_ids=self._stops)
            self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        return _build(so, self._compiler)

    def submit(self, so: StructuredOutput) -> Future:
        key = spec_key(so)
        with self._lock:
            future = self._futures.get(key)
            if future is None or (future.done() and future.exception() is not None and
                                  not isinstance(future.exception(), InvalidArgument)):
                future = self._futures[key] = self._pool.submit(self._compile, so)
                while len(self._futures) > self._entries:
                    self._futures.popitem(last=False)
            self._futures.move_to_end(key)
            return future

    async def get(self, so: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar of `so`; the caller's event loop keeps running meanwhile."""
        future = self.submit(so)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout_s)
        except TimeoutError:
            raise InvalidArgument(f"structured output {so.kind} took longer than {self.timeout_s:g} s to compile "
                                  f"(--structured-compile-timeout); simplify it") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
