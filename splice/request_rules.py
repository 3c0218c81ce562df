"""The rules every EngineRequest obeys, whoever checks them: the preprocessor while it builds a request
(naming the caller's parts) and the engine when it re-validates one (docs/architecture.md, preprocessor step
6 and engine step 1). Only rules that need no model live here; the engine adds image rows vs its vision family.

Every failure is InvalidArgument; `where` / `what` name the offending thing for the message.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch

from splice.engine_request import PROMPT_EMBEDS, EngineRequest
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.sampling import SamplingParams
from splice.tensors import FLOAT_DTYPES

# vLLM's refusal (completions): supplied rows have no token whose logprob could be given.
PROMPT_LOGPROBS_WITH_EMBEDS = ("prompt_logprobs is not compatible with prompt embeds: their positions have no token "
                               "to score")


def _at(where: object) -> str:
    return f"{where}: " if where else ""


def check_ids(ids: Sequence[int], info: ModelInfo, where: object = "token_ids") -> None:
    """Every ID indexes the ENGINE's embedding table (vocab_rows, never a tokenizer's length). `where` names
    the sequence ("prompt[2]", "token_ids"); the index is the ID's position in `ids`."""
    for i, t in enumerate(ids):
        if not 0 <= t < info.vocab_rows:
            raise InvalidArgument(f"{_at(where)}token ID {t} (index {i}) is out of range: the engine's embedding "
                                  f"table has {info.vocab_rows} rows (IDs must be in [0, {info.vocab_rows}))")


def check_length(n: int, info: ModelInfo, where: object = "") -> None:
    """A prompt of `n` positions is nonempty and leaves at least one position to generate into."""
    if n == 0:
        raise InvalidArgument(f"{_at(where)}the prompt is empty")
    if n >= info.max_model_len:
        raise InvalidArgument(f"{_at(where)}the prompt is {n} positions long; the engine's max_model_len is "
                              f"{info.max_model_len} and at least one position must be left to generate",
                              param="input_tokens")


def check_rows(n: int, info: ModelInfo, what: str) -> None:
    """`n` rows of supplied embeddings: at least one, and fewer than the context holds."""
    if n < 1:
        raise InvalidArgument(f"{what} has {n} rows; at least 1 expected")
    if n >= info.max_model_len:
        raise InvalidArgument(f"{what} has {n} rows; the engine's max_model_len is {info.max_model_len} and at "
                              f"least one position must be left to generate")


def check_hidden(columns: int, info: ModelInfo, what: str) -> None:
    if columns != info.hidden_size:
        raise InvalidArgument(f"{what} has {columns} columns, expected hidden size {info.hidden_size}")


def check_float_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise InvalidArgument(f"{what} has dtype {str(dtype).removeprefix('torch.')}, expected a float dtype")


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t`, in one pass that allocates nothing of t's size: a sum is finite only if every
    summand is (NaN and Inf survive any addition), so a finite sum settles it. A non-finite sum may also be
    an overflow of finite values; only then the exact elementwise test runs."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    if bool(t.sum().isfinite()):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, what: str, why: str = "NaN or Inf") -> None:
    """`why` says what non-finite values mean here (a cast that overflowed, ...)."""
    if not all_finite(t):
        raise InvalidArgument(f"{what} holds non-finite values ({why})")


def check_spans(req: EngineRequest, info: ModelInfo) -> set[int]:
    """Each span lies inside the prompt, disjoint from the others, over its own prompt_embeds tensor of
    [length, hidden] float rows; every prompt_embeds tensor has a span. Returns the positions spans cover.
    The rows' values are check_values' concern."""
    used_tensors: set[int] = set()
    ends: list[tuple[int, int, int]] = []
    for i, span in enumerate(req.embed_spans):
        what = f"embed_spans[{i}] (offset {span.offset}, length {span.length})"
        if span.length < 1:
            raise InvalidArgument(f"{what}: length must be >= 1")
        if span.offset < 0 or span.offset + span.length > req.prompt_len:
            raise InvalidArgument(f"{what}: ends at {span.offset + span.length}, past the prompt's "
                                  f"{req.prompt_len} positions")
        if not 0 <= span.tensor_index < len(req.tensors):
            raise InvalidArgument(f"{what}: tensor_index {span.tensor_index} but {len(req.tensors)} tensors sent")
        named = req.tensors[span.tensor_index]
        tensor_what = f"{what}: tensors[{span.tensor_index}]"
        if named.name != PROMPT_EMBEDS:
            raise InvalidArgument(f"{tensor_what} is {named.name!r}, not {PROMPT_EMBEDS!r}")
        if span.tensor_index in used_tensors:
            raise InvalidArgument(f"{tensor_what} is already used by another span")
        used_tensors.add(span.tensor_index)
        t = named.tensor
        if t.dim() != 2:
            raise InvalidArgument(f"{tensor_what} has shape {list(t.shape)}, expected [{span.length}, "
                                  f"{info.hidden_size}]")
        if t.shape[0] != span.length:
            raise InvalidArgument(f"{tensor_what} has {t.shape[0]} rows, expected {span.length}")
        check_hidden(t.shape[1], info, tensor_what)
        check_float_dtype(t.dtype, tensor_what)
        ends.append((span.offset, span.offset + span.length, i))
    ends.sort()
    for (_, end_a, a), (start_b, _, b) in itertools.pairwise(ends):
        if start_b < end_a:
            raise InvalidArgument(f"embed_spans[{a}] and embed_spans[{b}] overlap at position {start_b}")
    for i, named in enumerate(req.tensors):
        if named.name == PROMPT_EMBEDS and i not in used_tensors:
            raise InvalidArgument(f"tensors[{i}] ({PROMPT_EMBEDS}) is referenced by no embed span")
    return {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}


# Sampling fields of token IDs that name at most the vocabulary's tokens (vLLM's rule for logit_bias and
# allowed_token_ids: each a token of it; more stop token IDs than tokens would repeat one)
VOCABULARY_BOUNDED = ("logit_bias", "allowed_token_ids", "stop_token_ids")


def check_control_counts(counts: Mapping[str, int], info: ModelInfo) -> None:
    """The VOCABULARY_BOUNDED fields' lengths (`counts`, by field) within the vocabulary: a face checks them before
    their entries become objects."""
    for field, n in counts.items():
        if n > info.vocab_rows:
            raise InvalidArgument(f"{field} holds {n} entries, more than the engine's vocabulary of "
                                  f"{info.vocab_rows} tokens (each names a token of it, vLLM's rule)")


def check_controls(sampling: SamplingParams, info: ModelInfo) -> None:
    """The token IDs of logit_bias, allowed_token_ids and bad_words index the engine's table, and
    allowed_token_ids leaves a token that can be generated (one not banned by a one-token bad word, nor, under
    min_tokens, an EOS or stop token ID)."""
    check_control_counts({name: len(getattr(sampling, name)) for name in VOCABULARY_BOUNDED}, info)
    for field, ids in sampling.token_ids().items():
        check_ids(ids, info, field)
    if not sampling.allowed_token_ids:
        return
    admitted = set(sampling.allowed_token_ids) - {s[0] for s in sampling.bad_words_token_ids if len(s) == 1}
    if not admitted:
        raise InvalidArgument("allowed_token_ids: every token it allows is banned by bad_words")
    if sampling.min_tokens and admitted <= {*info.eos_token_ids, *sampling.stop_token_ids}:
        raise InvalidArgument(f"allowed_token_ids allows only EOS or stop tokens, which min_tokens "
                              f"({sampling.min_tokens}) bans from the first token")


def check_max_tokens(sampling: SamplingParams, info: ModelInfo) -> None:
    """vLLM's rule for a request (the preprocessor's; the engine ends a sequence where its context does): max_tokens
    past the whole context is refused, not clamped (within it, an answer still ends where the context does, with
    finish_reason length)."""
    if sampling.max_tokens is not None and sampling.max_tokens > info.max_model_len:
        raise InvalidArgument(f"max_tokens={sampling.max_tokens} cannot be greater than max_model_len="
                              f"{info.max_model_len}; ask for fewer tokens", param="max_tokens")


def check_request(req: EngineRequest, info: ModelInfo, where: object = "token_ids") -> set[int]:
    """Length, IDs, sampling controls and spans (`where` names the IDs); returns the positions spans cover."""
    check_length(req.prompt_len, info)
    check_ids(req.token_ids, info, where)
    check_controls(req.sampling, info)
    if req.sampling.prompt_logprobs is not None and req.embed_spans:
        raise InvalidArgument(PROMPT_LOGPROBS_WITH_EMBEDS)
    return check_spans(req, info)


def check_values(req: EngineRequest) -> None:
    """The supplied rows are finite. A separate pass over every value: the preprocessor checks each part's
    rows as it decodes them, naming the part, and needs no second pass."""
    for i, named in enumerate(req.tensors):
        if named.name == PROMPT_EMBEDS:
            check_finite(named.tensor, f"tensors[{i}] ({PROMPT_EMBEDS})")
