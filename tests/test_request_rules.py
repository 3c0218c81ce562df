"""The request rules shared by the preprocessor and the engine, called directly: each names its subject."""

from __future__ import annotations

import pytest
import torch

from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import check_finite, check_float_dtype, check_hidden, check_ids, check_length, check_rows

INFO = ModelInfo("t", "LlamaForCausalLM", vocab_rows=10, hidden_size=4, dtype="float32", max_model_len=8)


def test_ids_name_the_sequence_and_index():
    check_ids([0, 9], INFO)
    with pytest.raises(InvalidArgument, match=r"^prompt\[2\]: token ID 10 \(index 1\) is out of range: .* 10 rows"):
        check_ids([3, 10], INFO, "prompt[2]")
    with pytest.raises(InvalidArgument, match=r"^token_ids: token ID -1 \(index 0\)"):
        check_ids([-1], INFO)


def test_length_leaves_one_position_to_generate():
    check_length(7, INFO)
    with pytest.raises(InvalidArgument, match=r"^the prompt is empty"):
        check_length(0, INFO)
    with pytest.raises(InvalidArgument, match=r"^prompt\[1\]: the prompt is 8 positions long; .*max_model_len is 8"):
        check_length(8, INFO, "prompt[1]")


def test_rows_hidden_dtype_and_values():
    check_rows(7, INFO, "x")
    with pytest.raises(InvalidArgument, match=r"^x has 0 rows; at least 1"):
        check_rows(0, INFO, "x")
    with pytest.raises(InvalidArgument, match=r"^x has 8 rows; the engine's max_model_len is 8"):
        check_rows(8, INFO, "x")
    with pytest.raises(InvalidArgument, match=r"^x has 5 columns, expected hidden size 4"):
        check_hidden(5, INFO, "x")
    with pytest.raises(InvalidArgument, match=r"^x has dtype int32, expected a float dtype"):
        check_float_dtype(torch.int32, "x")
    check_finite(torch.zeros(2, 4), "x")
    with pytest.raises(InvalidArgument, match=r"^x holds non-finite values \(NaN or Inf\)"):
        check_finite(torch.tensor([0.0, float("-inf")]), "x")
    with pytest.raises(InvalidArgument, match=r"non-finite values \(they overflow\)"):
        check_finite(torch.tensor([float("nan")]), "x", "they overflow")
