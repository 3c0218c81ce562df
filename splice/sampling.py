"""SamplingParams: the one object that travels unchanged from the edge to the sampler.

Defaults for the proto's `optional` fields are applied here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from splice.errors import InvalidArgument
from splice.v1 import common_pb2

# Stop strings are matched on every decoded delta; a bound keeps that cheap and the request small.
MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 256
# Below this a temperature is greedy: dividing logits by it would overflow to inf and softmax to NaN.
GREEDY_EPS = 1e-5
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
# Each integer field's range, [low, high]: what it means, within what its wire type (common.proto) holds. Checked
# here for every caller, so that no value reaches to_pb that protobuf cannot hold; the HTTP schemas bound their
# fields with these same numbers (preprocessor/http/schemas.py).
INT_RANGES: dict[str, tuple[int, int]] = {
    "top_k": (0, INT32_MAX),  # int32; 0 = off
    "seed": (0, 2**63 - 1),  # uint64, kept within a signed 64-bit generator seed
    "max_tokens": (1, UINT32_MAX),  # uint32
    "stop_token_ids": (0, INT32_MAX),  # int32 token IDs
}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # < GREEDY_EPS (e.g. 0) = greedy
    top_p: float = 1.0  # (0, 1]; 1 = off
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None = nondeterministic
    max_tokens: int | None = None  # None = until the context is full
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature > 100.0:  # `not >=` also catches NaN
            raise InvalidArgument(f"sampling.temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        _check_range("top_k", self.top_k)
        if self.max_tokens is not None:
            _check_range("max_tokens", self.max_tokens)
        if self.seed is not None:
            _check_range("seed", self.seed)
        for i, t in enumerate(self.stop_token_ids):
            _check_range("stop_token_ids", t, f"[{i}]")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(f"sampling.stop holds {len(self.stop)} strings; at most {MAX_STOP_STRINGS}")
        for i, s in enumerate(self.stop):
            if not s or len(s) > MAX_STOP_LEN:
                raise InvalidArgument(f"sampling.stop[{i}] must be 1..{MAX_STOP_LEN} characters, got {len(s)}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @classmethod
    def from_pb(cls, pb: common_pb2.SamplingParams) -> SamplingParams:
        return cls(
            temperature=pb.temperature if pb.HasField("temperature") else 1.0,
            top_p=pb.top_p if pb.HasField("top_p") else 1.0,
            top_k=pb.top_k if pb.HasField("top_k") else 0,
            seed=pb.seed if pb.HasField("seed") else None,
            max_tokens=pb.max_tokens if pb.HasField("max_tokens") else None,
            stop_token_ids=tuple(pb.stop_token_ids),
            stop=tuple(pb.stop),
            ignore_eos=pb.ignore_eos,
            logprobs=pb.logprobs,
            skip_special_tokens=pb.skip_special_tokens if pb.HasField("skip_special_tokens") else True,
        )

    def to_pb(self) -> common_pb2.SamplingParams:
        pb = common_pb2.SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=list(self.stop_token_ids),
            stop=list(self.stop),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            skip_special_tokens=self.skip_special_tokens,
        )
        if self.seed is not None:
            pb.seed = self.seed
        if self.max_tokens is not None:
            pb.max_tokens = self.max_tokens
        return pb


def _check_range(name: str, value: int, index: str = "") -> None:
    low, high = INT_RANGES[name]
    if not low <= value <= high:
        raise InvalidArgument(f"sampling.{name}{index} must be in [{low}, {high}], got {value}")
