"""Property-based fuzzing (hypothesis) of every public RPC of a running preprocessor: raw bytes, mutated valid
messages and structured requests with hostile values. Every answer must be a defined status (never UNKNOWN
or INTERNAL, which would be a crash path), and the service must serve a good request after each batch.
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
STRUCTURED = {"Chat": chat, "Complete": complete, "Tokenize": tokenize, "Detokenize": detokenize,
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
        """One batch per RPC of structured, mutated and raw examples; True when all answers were defined and the
        service served after every batch."""
        rng = random.Random(seed)
        healthy = True
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
