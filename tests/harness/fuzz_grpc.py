"""Property-based fuzzing (hypothesis) of every public RPC of a running preprocessor: raw bytes, mutated valid
messages and structured requests with hostile values, deep JSON in every JSON-typed field among them (tools,
tool_choice, a message's tool_calls and their arguments' text, chat_template_kwargs, mm_processor_kwargs, documents,
a structured output's spec), as deep as protobuf parses and deeper. Every answer must be a defined status (never
UNKNOWN or INTERNAL, which would be a crash path), and the service must serve a good request after each batch.
tests/integration/test_fuzz.py runs a short batch; bench/fuzz.py a long one."""

from __future__ import annotations

import collections
import random

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splice.v1 import common_pb2
from splice.v1 import preprocessor_pb2 as pb

# A defined status: the request's fault, a limit, or the service's state; never a crash (UNKNOWN / INTERNAL).
DEFINED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAUTHENTICATED}
METHODS = {"Chat": (pb.ChatRequest, True), "Complete": (pb.CompleteRequest, True),
           "Tokenize": (pb.TokenizeRequest, False), "Detokenize": (pb.DetokenizeRequest, False),
           "GetModelInfo": (common_pb2.GetModelInfoRequest, False)}
DTYPES = ["float32", "float16", "bfloat16", "int64", "bool", "complex64", "", "float32\x00"]

texts = st.text(max_size=40)
small_ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
tensor = st.builds(lambda d, shape, data: common_pb2.Tensor(dtype=d, shape=shape, data=data),
                   st.sampled_from(DTYPES), st.lists(st.one_of(st.integers(0, 70000), st.sampled_from(
                       [-1, 2**31, 2**40, 2**63 - 1, -(2**63)])), max_size=4), st.binary(max_size=256))
embeds = st.one_of(st.builds(lambda t: pb.PromptEmbeds(tensor=t), tensor),
                   st.builds(lambda s: pb.PromptEmbeds(torch_base64=s), texts),
                   st.builds(lambda b: pb.PromptEmbeds(safetensors=b), st.binary(max_size=128)))
image = st.one_of(st.builds(lambda b: pb.ImageInput(data=b), st.binary(max_size=256)),
                  st.builds(lambda s: pb.ImageInput(url=s), st.sampled_from(["data:image/png;base64,AAAA", "http://x",
                                                                              "data:,", ""])),
                  st.builds(lambda s: pb.ImageInput(path=s), st.sampled_from(["/etc/passwd", "../x", ""])))
part = st.one_of(st.builds(lambda t: pb.ContentPart(text=t), texts), st.builds(lambda e: pb.ContentPart(
    prompt_embeds=e), embeds), st.builds(lambda i: pb.ContentPart(image=i), image), st.just(pb.ContentPart()))
message = st.builds(lambda role, parts, text: pb.ChatMessage(role=role, content=parts) if text is None else
                    pb.ChatMessage(role=role, text=text),
                    st.sampled_from(["user", "assistant", "system", "", "<image>", "x" * 300]),
                    st.lists(part, max_size=4), st.one_of(st.none(), texts))
sampling = st.builds(lambda t, p, k, m, seed, stop: common_pb2.SamplingParams(
    temperature=t, top_p=p, top_k=k, max_tokens=m, seed=seed, stop=stop),
    st.floats(allow_nan=True, allow_infinity=True, width=32), st.floats(width=32), small_ints,
    st.integers(0, 64), st.integers(0, 2**64 - 1), st.lists(texts, max_size=3))
chat = st.builds(lambda msgs, s, tpl: pb.ChatRequest(messages=msgs, sampling=s, **({"chat_template": tpl}
                                                                                   if tpl is not None else {})),
                 st.lists(message, max_size=3), sampling, st.one_of(st.none(), texts))
prompt_part = st.one_of(st.builds(lambda t: pb.PromptPart(text=t), texts),
                        st.builds(lambda ids: pb.PromptPart(token_ids=pb.TokenIds(ids=ids)), st.lists(small_ints,
                                                                                                      max_size=8)),
                        st.builds(lambda e: pb.PromptPart(prompt_embeds=e), embeds))
complete = st.builds(lambda parts, s: pb.CompleteRequest(prompt=parts, sampling=s), st.lists(prompt_part,
                                                                                            max_size=4), sampling)
tokenize = st.one_of(st.builds(lambda t, a: pb.TokenizeRequest(text=t, add_special_tokens=a), texts, st.booleans()),
                     st.builds(lambda c: pb.TokenizeRequest(chat=c), chat))
detokenize = st.builds(lambda ids: pb.DetokenizeRequest(token_ids=ids), st.lists(small_ints, max_size=16))
DEPTHS = [3, 33, 60]  # within splice/json_depth.py's cap, just past it, past what protobuf parses (~34 in a request)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: written by hand, since protobuf itself refuses to build a Struct nested past its
    parse limit (it copies by parsing)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _struct(fields: dict[str, bytes]) -> bytes:
    """A Struct's encoding from its values' encodings."""
    return b"".join(_field(1, _field(1, key.encode()) + _field(2, value)) for key, value in fields.items())


def _text(value: str) -> bytes:
    return _field(3, value.encode())  # Value.string_value


def deep_value(depth: int, kind: str = "object") -> bytes:
    """A Value's encoding nesting `depth` objects (or lists) around a string, level by level (no recursion)."""
    value = _text("x")
    for _ in range(depth):
        value = _field(5, _struct({"a": value})) if kind == "object" else _field(6, _field(1, value))
    return value


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth if depth < 1000 else "[" * depth


def _number(message: type, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number


def _deep_chat(where: str, depth: int, kind: str) -> bytes:
    """A short chat's bytes whose `where` holds JSON nested `depth` deep (`kind`: arrays or objects)."""
    req = pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="Hi")], sampling=common_pb2.SamplingParams(
        max_tokens=2, temperature=0.0))
    extra = b""
    function = {"name": _text("f")}
    if where in ("tools", "tool_choice"):
        if where == "tools":
            function["parameters"] = deep_value(depth, kind)
            req.tool_choice.string_value = "required"
        else:
            extra += _field(_number(pb.ChatRequest, "tool_choice"), deep_value(depth, kind))
        tool = _struct({"type": _text("function"), "function": _field(5, _struct(function))})
        extra += _field(_number(pb.ChatRequest, "tools"), tool)
    elif where in ("tool_calls", "arguments"):  # arguments as an object, or as text (OpenAI's)
        function["arguments"] = deep_value(depth, kind) if where == "tool_calls" else _text(deep_text(depth * 50))
        call = _struct({"id": _text("c"), "type": _text("function"), "function": _field(5, _struct(function))})
        message = _field(_number(pb.ChatMessage, "role"), b"assistant") + \
            _field(_number(pb.ChatMessage, "tool_calls"), call)
        extra += _field(_number(pb.ChatRequest, "messages"), message)
    elif where in ("chat_template_kwargs", "mm_processor_kwargs", "documents"):
        extra += _field(_number(pb.ChatRequest, where), _struct({"a": deep_value(depth, kind)}))
    else:  # a structured output's spec, as JSON text
        spec = '{"items":' * (depth * 30) + "{}" + "}" * (depth * 30) if kind == "object" else deep_text(depth * 30)
        req.sampling.structured.CopyFrom(common_pb2.StructuredOutput(
            kind=common_pb2.StructuredOutput.KIND_JSON if where == "json" else common_pb2.StructuredOutput.KIND_CHOICE,
            spec=spec))
    return req.SerializeToString() + extra  # (a field appended to a message's bytes is one more of it)


DEEP_FIELDS = ["tools", "tool_choice", "tool_calls", "arguments", "chat_template_kwargs", "mm_processor_kwargs",
               "documents", "json", "choice"]
deep_chat = st.builds(lambda where, depth, kind: pb.ChatRequest.FromString(_deep_chat(where, depth, kind)),
                      st.sampled_from(DEEP_FIELDS), st.sampled_from([3, 14]), st.sampled_from(["object", "list"]))
STRUCTURED = {"Chat": st.one_of(chat, deep_chat), "Complete": complete, "Tokenize": tokenize, "Detokenize": detokenize,
              "GetModelInfo": st.just(common_pb2.GetModelInfoRequest())}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """`data` with 1-4 bytes overwritten or inserted (both faces' byte-level fuzzing)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out and rng.random() < 0.7:
            out[rng.randrange(len(out))] = rng.randrange(256)
        else:
            out.insert(rng.randrange(len(out) + 1), rng.randrange(256))
    return bytes(out)


class Fuzzer:
    def __init__(self, target: str, timeout: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(target)
        self.timeout = timeout
        self.counts: collections.Counter = collections.Counter()
        self.undefined: list[str] = []

    def call(self, method: str, payload: bytes) -> grpc.StatusCode:
        _, streaming = METHODS[method]
        path = f"/splice.v1.Preprocessor/{method}"
        try:
            if streaming:  # short answers: every example asks for few tokens or fails fast
                for _ in self.channel.unary_stream(path)(payload, timeout=self.timeout):
                    pass
            else:
                self.channel.unary_unary(path)(payload, timeout=self.timeout)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
            if code not in DEFINED:
                self.undefined.append(f"{method}: {code.name}: {err.details()} <- {payload[:80]!r}")
        self.counts[(method, code.name)] += 1
        return code

    def serves(self) -> bool:
        req = pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="Hi")],
                             sampling=common_pb2.SamplingParams(max_tokens=2, temperature=0.0))
        return self.call("Chat", req.SerializeToString()) == grpc.StatusCode.OK

    def run(self, examples: int, seed: int) -> bool:
        """Every JSON-typed field nested deep once, then one batch per RPC of structured, mutated and raw examples;
        True when all answers were defined and the service served after every batch."""
        rng = random.Random(seed)
        for where in DEEP_FIELDS:
            for depth in DEPTHS:
                self.call("Chat", _deep_chat(where, depth, rng.choice(["object", "list"])))
        healthy = self.serves()
        for method, strategy in STRUCTURED.items():
            self._batch(method, strategy, examples, rng)
            healthy &= self.serves()
        return healthy and not self.undefined

    def _batch(self, method: str, strategy: st.SearchStrategy, examples: int, rng: random.Random) -> None:
        @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(strategy, st.binary(max_size=64))
        def one(message, raw):
            data = message.SerializeToString()
            self.call(method, data)
            self.call(method, mutate(data, rng))
            self.call(method, raw)

        one()
