"""Property-based fuzzing (hypothesis) of the preprocessor's HTTP face: JSON bodies for chat, completions, Tokenize
and Detokenize with hostile values (integers past any range, lone surrogates, wrong types, deep nesting, huge
strings, NaN), byte mutations of them and raw bytes, after SEEDS: requests that once broke the face, among them deep
JSON (arrays, objects, and JSON text nested in a string) in every JSON-typed field: tools, tool_choice, a message's
tool_calls and their arguments, response_format / structured_outputs / guided_json schemas and specs,
chat_template_kwargs, mm_processor_kwargs, documents, logit_bias. No answer may be a
5xx (or no answer): every hostile input is the caller's fault, a 4xx naming it. The face must serve a normal
request after each batch. bench/fuzz.py runs it (--face http); tests/integration/test_fuzz.py runs a short one.
"""

from __future__ import annotations

import collections
import json
import random
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessor.http.convert import UNHONOURED
from splice.structured_fields import FIELDS as STRUCTURED_FIELDS
from tests.harness.fuzz_grpc import mutate

HI = [{"role": "user", "content": "Hi"}]
HUGE_INTS = [2**31 + 5, 2**32 + 1, 2**40, 2**63, 2**64, -(2**63) - 1, 10**30, -1, 0]
SURROGATES = ["\ud800", "a\udfffb", "\udbff\ud800", "\ude00x"]
DEEP = "__deep__"  # a string replaced by deeply nested JSON arrays once the body is serialized
DEEP_OBJECT = "__deep_object__"  # ... by objects nested as deep
DEEP_TEXT = "__deep_text__"  # ... by a string holding nested JSON arrays' text (a spec, a call's arguments)

ints = st.one_of(st.integers(-8, 8), st.sampled_from(HUGE_INTS))
# Generation stays short: an unset or valid large max_tokens would decode up to the whole context.
max_tokens = st.one_of(st.integers(-3, 4), st.sampled_from([2**32, 2**32 + 1, 2**64, -(2**40), 10**30]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -0.0, 1e-320]))
texts = st.one_of(st.text(max_size=24), st.sampled_from([*SURROGATES, "", "\x00", "<image>", "x" * 5000]),
                  st.builds(lambda s, k, sur: s[:k] + sur + s[k:], st.text(max_size=8), st.integers(0, 8),
                            st.sampled_from(SURROGATES)))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.sampled_from([DEEP, DEEP_OBJECT, DEEP_TEXT]))
anything = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                        st.dictionaries(texts, kids, max_size=3)), max_leaves=8)
urls = st.one_of(texts, st.sampled_from(["data:image/png;base64,AAAA", "data:,", "http://127.0.0.1:1/x.png",
                                         "http://[::1", "http://h:99999/", "file:///etc/passwd", "ftp://h/p"]))
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": urls})}),
    st.fixed_dictionaries({"type": st.just("prompt_embeds"), "data": texts}),
    st.fixed_dictionaries({"type": texts}), anything)
messages = st.lists(st.one_of(st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system"]), texts)},
                                                    optional={"content": st.one_of(texts, st.lists(parts, max_size=3),
                                                                                   anything)}),
                              anything), max_size=3)
SAMPLING = {  # every generation field, each with hostile values of its own kind and of any kind
    "max_tokens": max_tokens, "max_completion_tokens": max_tokens, "top_k": ints, "seed": ints, "n": ints,
    "temperature": floats, "top_p": floats, "stop": st.one_of(texts, st.lists(texts, max_size=3)),
    "stop_token_ids": st.lists(ints, max_size=3), "stream": st.booleans(), "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(), "request_id": texts, "model": texts,
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), anything),
    **{name: anything for name in UNHONOURED},
    **{name: anything for name in STRUCTURED_FIELDS},
}
LENGTHS = ("max_tokens", "max_completion_tokens", "stream")  # (any other value of these may be a long generation)
generation = st.fixed_dictionaries({}, optional={k: v if k in LENGTHS else st.one_of(v, anything)
                                                 for k, v in SAMPLING.items()})
deep = st.sampled_from([DEEP, DEEP_OBJECT, DEEP_TEXT])
tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "g"])}, optional={"parameters": st.one_of(deep, anything)})}), max_size=2)
tool_calls = st.lists(st.fixed_dictionaries({"id": st.just("c"), "type": st.just("function"), "function":
                                             st.fixed_dictionaries({"name": st.just("f"),
                                                                    "arguments": st.one_of(deep, texts, anything)})}),
                      max_size=2)
messages = st.one_of(messages, st.lists(st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                                                               "tool_calls": tool_calls}), min_size=1, max_size=2))
chat_only = st.fixed_dictionaries({"messages": st.one_of(messages, anything)}, optional={
    "tools": st.one_of(tools, anything), "tool_choice": st.one_of(st.sampled_from(["none", "required", "auto"]), deep,
                                                                  anything),
    "mm_processor_kwargs": st.one_of(deep, anything), "documents": st.one_of(st.lists(deep, max_size=2), anything),
    "logprobs": st.one_of(st.booleans(), anything), "top_logprobs": st.one_of(ints, anything),
    "chat_template": st.one_of(texts, anything), "chat_template_kwargs": st.one_of(anything, st.dictionaries(
        texts, anything, max_size=3)), "add_generation_prompt": st.one_of(st.booleans(), anything)})
completion_only = st.fixed_dictionaries({}, optional={
    "prompt": st.one_of(texts, st.lists(ints, max_size=4), st.lists(texts, max_size=2),
                        st.lists(st.lists(ints, max_size=3), max_size=2), anything),
    "prompt_embeds": st.one_of(texts, st.lists(texts, max_size=2), anything), "logprobs": st.one_of(ints, anything),
    "echo": anything, "suffix": anything})
BODIES = {
    "/v1/chat/completions": st.builds(lambda a, b: {**a, **b}, generation, chat_only),
    "/v1/completions": st.builds(lambda a, b: {**a, **b}, generation, completion_only),
    "/tokenize": st.one_of(st.fixed_dictionaries({"prompt": texts}, optional={"add_special_tokens": anything,
                                                                              "return_token_strs": anything}),
                           chat_only, anything),
    "/detokenize": st.one_of(st.fixed_dictionaries({"tokens": st.one_of(st.lists(ints, max_size=6), anything)}),
                             anything),
}


def _long(n: int) -> str:
    return "hello " * (n // 6)


# Requests that once got a 5xx or no answer (huge integers, lone surrogates, huge and deeply nested bodies),
# each once per run, before the generated examples.
SEEDS: list[tuple[str, object]] = [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2**32 + 1}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2**64}),
    ("/v1/chat/completions", {"messages": HI, "top_k": 2**40, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": HI, "stop_token_ids": [2**31 + 5], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": _long(10_000_000)}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": HI * 100_000, "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}] * 200}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "chat_template_kwargs": {"x": DEEP}}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "logit_bias": DEEP}),
    *[("/v1/chat/completions", {"messages": HI, "max_tokens": 2, **fields}) for fields in [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP_OBJECT}}], "tool_choice": c}
        for c in ("none", "required", "auto")]],
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": DEEP_OBJECT}),
    *[("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}, *HI], "max_tokens": 2})
      for arguments in (DEEP_TEXT, DEEP_OBJECT)],
    *[("/v1/chat/completions", {"messages": HI, "max_tokens": 2, **fields}) for fields in [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": DEEP_OBJECT}}},
        {"response_format": {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": DEEP_OBJECT,
                                                                       "end": "</f>"}], "triggers": ["<f>"]}},
        {"structured_outputs": {"json": DEEP_OBJECT}}, {"structured_outputs": {"json": DEEP_TEXT}},
        {"structured_outputs": {"choice": DEEP}}, {"guided_json": DEEP_TEXT}, {"guided_json": DEEP_OBJECT},
        {"guided_choice": DEEP}, {"chat_template_kwargs": {"x": DEEP_OBJECT}}, {"mm_processor_kwargs": DEEP_OBJECT},
        {"documents": [DEEP_OBJECT]}]],
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "guided_json": DEEP_TEXT}),
    ("/tokenize", {"messages": HI, "tools": [{"type": "function", "function": {"name": "f",
                                                                               "parameters": DEEP_OBJECT}}]}),
    ("/v1/completions", {"prompt": _long(10_000_000), "max_tokens": 2}),
    ("/v1/completions", {"prompt": [2**31 + 5], "max_tokens": 2}),
    ("/tokenize", {"prompt": _long(10_000_000)}),
    ("/tokenize", {"prompt": "a\ud800"}),
    ("/detokenize", {"tokens": [2**64]}),
    ("/detokenize", DEEP),
]


def serialize(body: object, depth: int = 0) -> bytes:
    """JSON as a hostile client writes it: lone surrogates as \\ud800 escapes, NaN and Infinity as bare words, and
    DEEP as arrays nested `depth` levels (default: deeper than the JSON parser's recursion allows), DEEP_OBJECT as
    objects, DEEP_TEXT as a string of that many nested arrays' text."""
    text = json.dumps(body, ensure_ascii=True, allow_nan=True)
    n = depth or 100_000
    return (text.replace(json.dumps(DEEP), "[" * n + "]" * n)
            .replace(json.dumps(DEEP_OBJECT), '{"a":' * n + "{}" + "}" * n)
            .replace(json.dumps(DEEP_TEXT), '"' + "[" * n + "]" * n + '"')).encode()


class HttpFuzzer:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self.counts: collections.Counter = collections.Counter()
        self.undefined: list[str] = []  # 5xx answers and requests that got no answer

    def close(self) -> None:
        self.client.close()

    def call(self, path: str, content: bytes, content_type: str = "application/json") -> int:
        try:
            status = self.client.post(path, content=content, headers={"content-type": content_type}).status_code
        except httpx.HTTPError as exc:
            status = 0
            self.undefined.append(f"{path}: no answer ({type(exc).__name__}: {exc}) <- {content[:80]!r}")
        if status >= 500:
            self.undefined.append(f"{path}: HTTP {status} <- {content[:120]!r}")
        self.counts[(path, status)] += 1
        return status

    def serves(self) -> bool:
        body = {"messages": HI, "max_tokens": 2, "temperature": 0}
        return self.call("/v1/chat/completions", serialize(body)) == 200

    def run(self, examples: int, seed: int, budget: float | None = None) -> bool:
        """The seeds, then one batch per route of generated, mutated and raw bodies (each batch stops early once
        `budget` seconds have passed since the start); True when no answer was a 5xx and the face served after every
        batch."""
        rng = random.Random(seed)
        end = time.monotonic() + budget if budget else float("inf")
        for path, body in SEEDS:
            self.call(path, serialize(body, depth=rng.choice([40, 500, 100_000])))
        healthy = self.serves()
        for path, strategy in BODIES.items():
            self._batch(path, strategy, examples, rng, end)
            healthy &= self.serves()
        return healthy and not self.undefined

    def _batch(self, path: str, strategy: st.SearchStrategy, examples: int, rng: random.Random, end: float) -> None:
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(strategy, st.binary(max_size=64), st.sampled_from([40, 500, 100_000]))
        def one(body, raw, depth):
            if time.monotonic() > end:
                return
            if isinstance(body, dict) and "max_tokens" not in body and "max_completion_tokens" not in body:
                body["max_tokens"] = 2  # unset would decode to the end of the context
            data = serialize(body, depth)
            self.call(path, data)
            self.call(path, mutate(data, rng))
            self.call(path, raw, rng.choice(["application/json", "text/plain", "application/x-www-form-urlencoded"]))

        one()
