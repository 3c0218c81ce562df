"""SamplingParams: the one object that travels unchanged from the edge to the sampler.

Defaults for the proto's `optional` fields are applied here and nowhere else. The limits are vLLM's
(vllm/sampling_params.py), so a request vLLM accepts is accepted here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from splice.errors import InvalidArgument
from splice.structured_output import StructuredOutput
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
    "top_logprobs": (0, 20),  # alternatives per token (OpenAI's bound, vLLM's default max_logprobs)
    "min_tokens": (0, UINT32_MAX),  # uint32
    "logit_bias": (0, INT32_MAX),  # its keys: int32 token IDs
    "allowed_token_ids": (0, INT32_MAX),  # int32 token IDs
    "prompt_logprobs": (0, 20),  # alternatives per prompt position (vLLM's default max_logprobs)
    "logprob_token_ids": (0, INT32_MAX),  # int32 token IDs
    # choices per prompt: vLLM sets no upper bound (--max-num-seqs does, at run time); OpenAI's API takes 1..128
    "n": (1, 128),
}
PENALTY_RANGE = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's and vLLM's range)
LOGIT_BIAS_RANGE = 100.0  # logit_bias values lie in [-100, 100] (OpenAI's range)
# bad_words: each word is tokenized twice (with and without a leading space), and every resulting sequence is
# checked against each row's output at every step; vLLM's default cap (VLLM_MAX_NUM_BAD_WORDS) is the same.
MAX_BAD_WORDS = 128
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's bound on logprob_token_ids (MAX_LOGPROB_TOKEN_IDS)
# A structured output's spec (schema, regex, grammar, choices), in characters: compile time and memory grow with it,
# and a request is refused above it before anything is parsed or compiled.
MAX_STRUCTURED_SPEC = 64 * 1024
# The engine refuses a structured output whose grammar takes longer than this to compile (--structured-compile-timeout;
# ordinary schemas compile in well under a second).
DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S = 10.0
# MiB of compiled grammars (their token masks) the engine keeps, least recently used evicted first
# (--structured-cache-mb): an ordinary JSON schema compiles to tens of KiB on a 49k vocabulary; a 64 KiB grammar of
# negated character classes to ~90 MiB.
DEFAULT_STRUCTURED_CACHE_MB = 64
# cache_salt, in characters: it only separates one tenant's cached prefixes from another's, so a salt this long is
# plenty (a UUID is 36) and a request cannot carry megabytes in it.
MAX_CACHE_SALT = 256
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def _pairs(bias: Mapping[int, float] | tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    items = bias.items() if isinstance(bias, Mapping) else bias
    return tuple(sorted((int(k), float(v)) for k, v in items))


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
    top_logprobs: int = 0  # [0, 20]: also the most likely tokens at each step and their logprobs (needs logprobs)
    skip_special_tokens: bool = True
    # --- penalties and masks (vLLM's semantics; engine/logits_controls.py applies them) ---
    presence_penalty: float = 0.0  # [-2, 2]; subtracted once from each token generated so far
    frequency_penalty: float = 0.0  # [-2, 2]; subtracted once per time a token was generated so far
    repetition_penalty: float = 1.0  # > 0; divides positive / multiplies negative logits of prompt+output tokens
    min_p: float = 0.0  # [0, 1]; drops tokens below min_p x the top token's probability (sampling only)
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens are out
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token ID, [-100, 100]) added to its logit; a dict is taken
    allowed_token_ids: tuple[int, ...] = ()  # only these may be generated; () = all
    bad_words: tuple[str, ...] = ()  # words never generated (tokenized by the preprocessor into the next field)
    # the token sequences of bad_words, written by the preprocessor (callers leave it empty): the last token of
    # each is banned when the output so far ends with the others
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    include_stop_str_in_output: bool = False  # the matched stop string ends the returned text
    # --- prompt logprobs and chosen logprobs (vLLM's) ---
    # [0, 20]: the logprob and rank of every prompt token and this many most likely tokens at each prompt position,
    # computed in the request's own prefill (engine/prompt_logprobs.py), sent once (with choice 0's first token when
    # n > 1); None = off
    prompt_logprobs: int | None = None
    # with logprobs: the logprobs of exactly these tokens at each step, instead of the top_logprobs most likely
    logprob_token_ids: tuple[int, ...] = ()
    # --- structured outputs (vLLM's; splice/grammar.py compiles them, engine/grammar_masks.py applies them) ---
    structured: StructuredOutput | None = None  # the output follows this grammar; None = free text
    # choices from the one prompt, [1, 128]: prefilled once, then n sequences; with a seed, choice i samples with
    # seed + i (vLLM's parallel sampling), so it equals a request of n = 1 with that seed (`choice`)
    n: int = 1
    # vLLM's cache_salt, 1..MAX_CACHE_SALT characters: the prefix cache reuses a prefix only between requests with
    # the same salt (None = unsalted, shared with other unsalted requests)
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", _pairs(self.logit_bias))
        object.__setattr__(self, "bad_words_token_ids", tuple(tuple(s) for s in self.bad_words_token_ids))
        object.__setattr__(self, "logprob_token_ids", tuple(self.logprob_token_ids))
        if not (self.temperature >= 0.0) or self.temperature > 100.0:  # `not >=` also catches NaN
            raise InvalidArgument(f"sampling.temperature must be in [0, 100], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidArgument(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        _check_range("top_k", self.top_k)
        if self.max_tokens is not None:
            _check_range("max_tokens", self.max_tokens)
        if self.seed is not None:
            _check_range("seed", self.seed)
        _check_range("n", self.n)
        if self.seed is not None and self.seed + self.n - 1 > INT_RANGES["seed"][1]:
            raise InvalidArgument(f"sampling.seed + n - 1 (the last choice's seed) must be <= {INT_RANGES['seed'][1]}, "
                                  f"got seed {self.seed} and n {self.n}")
        for i, t in enumerate(self.stop_token_ids):
            _check_range("stop_token_ids", t, f"[{i}]")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(f"sampling.stop holds {len(self.stop)} strings; at most {MAX_STOP_STRINGS}")
        for i, s in enumerate(self.stop):
            if not s or len(s) > MAX_STOP_LEN:
                raise InvalidArgument(f"sampling.stop[{i}] must be 1..{MAX_STOP_LEN} characters, got {len(s)}")
        self._check_controls()
        self._check_cache_salt()

    def _check_cache_salt(self) -> None:
        salt = self.cache_salt
        if salt is None:
            return
        if not isinstance(salt, str) or not salt:  # vLLM's rule and words
            raise InvalidArgument("Parameter 'cache_salt' must be a non-empty string if provided.")
        if len(salt) > MAX_CACHE_SALT:
            raise InvalidArgument(f"sampling.cache_salt is {len(salt)} characters; at most {MAX_CACHE_SALT}")

    def _check_controls(self) -> None:
        _check_range("top_logprobs", self.top_logprobs)
        if self.top_logprobs and not self.logprobs:
            raise InvalidArgument("sampling.top_logprobs needs logprobs set")
        if self.prompt_logprobs is not None:
            _check_range("prompt_logprobs", self.prompt_logprobs)
        self._check_logprob_token_ids()
        self._check_structured()
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -PENALTY_RANGE <= value <= PENALTY_RANGE:  # (NaN fails every comparison)
                raise InvalidArgument(f"sampling.{name} must be in [-2, 2], got {value}")
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            raise InvalidArgument(f"sampling.repetition_penalty must be a finite number > 0, got "
                                  f"{self.repetition_penalty}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument(f"sampling.min_p must be in [0, 1], got {self.min_p}")
        _check_range("min_tokens", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidArgument(f"sampling.min_tokens must be <= max_tokens ({self.max_tokens}), got "
                                  f"{self.min_tokens}")
        for token, bias in self.logit_bias:
            _check_range("logit_bias", token, f": token ID {token}")
            if not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
                raise InvalidArgument(f"sampling.logit_bias[{token}] must be in [-100, 100], got {bias}")
        for i, t in enumerate(self.allowed_token_ids):
            _check_range("allowed_token_ids", t, f"[{i}]")
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise InvalidArgument(f"sampling.bad_words holds {len(self.bad_words)} words; at most {MAX_BAD_WORDS}")
        for i, word in enumerate(self.bad_words):
            if not word.strip() or len(word) > MAX_STOP_LEN:
                raise InvalidArgument(f"sampling.bad_words[{i}] must be 1..{MAX_STOP_LEN} characters and not only "
                                      f"spaces, got {word!r}")
        if len(self.bad_words_token_ids) > 2 * MAX_BAD_WORDS:
            raise InvalidArgument(f"sampling.bad_words_token_ids holds {len(self.bad_words_token_ids)} sequences; "
                                  f"at most {2 * MAX_BAD_WORDS}")
        for i, ids in enumerate(self.bad_words_token_ids):
            if not ids or any(not 0 <= t <= INT32_MAX for t in ids):
                raise InvalidArgument(f"sampling.bad_words_token_ids[{i}] must be nonempty token IDs >= 0, got "
                                      f"{list(ids)}")

    def _check_structured(self) -> None:
        so = self.structured
        if so is None:
            return
        if so.kind not in STRUCTURED_KINDS:
            raise InvalidArgument(f"sampling.structured.kind must be one of {', '.join(STRUCTURED_KINDS)}, got "
                                  f"{so.kind!r}")
        if len(so.spec) > MAX_STRUCTURED_SPEC:
            raise InvalidArgument(f"sampling.structured ({so.kind}) is {len(so.spec)} characters; at most "
                                  f"{MAX_STRUCTURED_SPEC}")
        if so.kind != "json_object" and not so.spec.strip():
            raise InvalidArgument(f"sampling.structured ({so.kind}) needs a spec")
        # The grammar alone decides which tokens may come and where the answer ends: a mask or a floor beside it
        # would be overridden (the grammar's end stops the answer before min_tokens) or leave no token at all.
        for name, set_ in (("allowed_token_ids", self.allowed_token_ids), ("bad_words", self.bad_words),
                           ("min_tokens", self.min_tokens)):
            if set_:
                raise InvalidArgument(f"sampling.{name} cannot be kept beside a structured output ({so.kind}; "
                                      f"response_format, structured_outputs, guided_*, or the schema tool_choice "
                                      f"required / a named function implies): the grammar decides which tokens come "
                                      f"and where the answer ends; send one or the other")

    def _check_logprob_token_ids(self) -> None:
        ids = self.logprob_token_ids
        if not ids:
            return
        if not self.logprobs:
            raise InvalidArgument("sampling.logprob_token_ids needs logprobs set")
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise InvalidArgument(f"sampling.logprob_token_ids holds {len(ids)} token IDs; at most "
                                  f"{MAX_LOGPROB_TOKEN_IDS}")
        for i, t in enumerate(ids):
            _check_range("logprob_token_ids", t, f"[{i}]")
        if self.top_logprobs not in (0, len(ids)):  # vLLM's rule when both are set
            raise InvalidArgument(f"sampling.top_logprobs must be 0 or len(logprob_token_ids) ({len(ids)}) when "
                                  f"logprob_token_ids is set, got {self.top_logprobs}")

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """The prefix cache must not serve this request's prompt from cached positions (vLLM's rule and name):
        prompt logprobs are computed from the prompt's own forward, position by position, so every position must
        run. The prefix cache (a later issue) checks this before it looks up a prefix."""
        return self.prompt_logprobs is not None

    def choice(self, index: int) -> SamplingParams:
        """Choice `index`'s own parameters: one sequence, sampling with seed + index when seeded (vLLM's rule)."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + index)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def penalized(self) -> bool:
        """Any of presence, frequency or repetition penalty is on."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def masked(self) -> bool:
        """A fixed change of the logits: logit_bias, allowed_token_ids or a one-token bad word."""
        return bool(self.logit_bias or self.allowed_token_ids or any(len(s) == 1 for s in self.bad_words_token_ids))

    def token_ids(self) -> dict[str, list[int]]:
        """Every token ID the controls name, by field: what must index the engine's vocabulary."""
        return {"logit_bias": [t for t, _ in self.logit_bias], "allowed_token_ids": list(self.allowed_token_ids),
                "bad_words": [t for s in self.bad_words_token_ids for t in s],
                "logprob_token_ids": list(self.logprob_token_ids), "stop_token_ids": list(self.stop_token_ids)}

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
            top_logprobs=pb.top_logprobs,
            skip_special_tokens=pb.skip_special_tokens if pb.HasField("skip_special_tokens") else True,
            presence_penalty=pb.presence_penalty,
            frequency_penalty=pb.frequency_penalty,
            repetition_penalty=pb.repetition_penalty if pb.HasField("repetition_penalty") else 1.0,
            min_p=pb.min_p,
            min_tokens=pb.min_tokens,
            logit_bias=dict(pb.logit_bias),
            allowed_token_ids=tuple(pb.allowed_token_ids),
            bad_words=tuple(pb.bad_words),
            bad_words_token_ids=tuple(tuple(s.ids) for s in pb.bad_words_token_ids),
            include_stop_str_in_output=pb.include_stop_str_in_output,
            prompt_logprobs=pb.prompt_logprobs if pb.HasField("prompt_logprobs") else None,
            logprob_token_ids=tuple(pb.logprob_token_ids),
            structured=_structured_from_pb(pb.structured) if pb.HasField("structured") else None,
            n=pb.n if pb.HasField("n") else 1,
            cache_salt=pb.cache_salt if pb.HasField("cache_salt") else None,
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
            top_logprobs=self.top_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            min_p=self.min_p,
            min_tokens=self.min_tokens,
            logit_bias=dict(self.logit_bias),
            allowed_token_ids=list(self.allowed_token_ids),
            bad_words=list(self.bad_words),
            bad_words_token_ids=[common_pb2.TokenSequence(ids=list(s)) for s in self.bad_words_token_ids],
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprob_token_ids=list(self.logprob_token_ids),
        )
        if self.prompt_logprobs is not None:
            pb.prompt_logprobs = self.prompt_logprobs
        if self.structured is not None:
            pb.structured.CopyFrom(common_pb2.StructuredOutput(
                kind=f"KIND_{self.structured.kind.upper()}", spec=self.structured.spec,
                disable_any_whitespace=self.structured.disable_any_whitespace))
        if self.seed is not None:
            pb.seed = self.seed
        if self.max_tokens is not None:
            pb.max_tokens = self.max_tokens
        if self.repetition_penalty != 1.0:
            pb.repetition_penalty = self.repetition_penalty
        if self.n != 1:
            pb.n = self.n
        if self.cache_salt is not None:
            pb.cache_salt = self.cache_salt
        return pb


def _check_range(name: str, value: int, index: str = "") -> None:
    low, high = INT_RANGES[name]
    if not low <= value <= high:
        raise InvalidArgument(f"sampling.{name}{index} must be in [{low}, {high}], got {value}")


def _structured_from_pb(pb: common_pb2.StructuredOutput) -> StructuredOutput:
    names = dict(common_pb2.StructuredOutput.Kind.items())
    name = next((n.removeprefix("KIND_").lower() for n, v in names.items() if v == pb.kind and v), None)
    if name is None:  # unset, or a kind from a newer proto
        raise InvalidArgument(f"sampling.structured.kind must be one of {', '.join(STRUCTURED_KINDS)}, got "
                              f"enum value {pb.kind}")
    # (the enum's names are the Kind literals)
    return StructuredOutput(name, pb.spec, pb.disable_any_whitespace)  # type: ignore[arg-type]
