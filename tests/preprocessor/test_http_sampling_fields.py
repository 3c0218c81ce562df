"""The HTTP face refuses sampling and output controls it does not implement (400 naming the field) instead of
serving the request without them; their "off" values, which clients send by default, are accepted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from preprocessor.http.convert import UNHONOURED, chat_sampling, completion_sampling
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest
from splice.errors import InvalidArgument

ASKING = {  # a value of each field that asks for something
    "length_penalty": 0.8, "best_of": 2, "use_beam_search": True, "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 8,
    "logits_processors": ["x"],
    "functions": [{"name": "f"}], "function_call": {"name": "f"},
}
MESSAGES = [{"role": "user", "content": "Hi"}]


def test_every_unhonoured_field_has_a_case():
    assert set(ASKING) == set(UNHONOURED)


@pytest.mark.parametrize("name", sorted(ASKING))
def test_a_field_that_asks_is_refused_by_name(name):
    with pytest.raises(InvalidArgument, match=f"^{name} is not supported") as chat:
        chat_sampling(ChatCompletionRequest(messages=MESSAGES, **{name: ASKING[name]}))
    assert repr(ASKING[name]) in chat.value.message
    with pytest.raises(InvalidArgument, match=f"^{name} is not supported"):
        completion_sampling(CompletionRequest(prompt="Hi", **{name: ASKING[name]}))


def test_off_values_and_unset_fields_are_served():
    off = {name: values[0] for name, values in UNHONOURED.items() if values}
    assert off["functions"] == []
    plain = chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0))
    assert chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0, response_format={"type": "text"},
                                               **off)) == plain
    assert chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0, function_call="auto",
                                               presence_penalty=0.0, repetition_penalty=1.0, logit_bias={},
                                               bad_words=[], min_tokens=0, min_p=0.0)) == plain
    nulls = dict.fromkeys(UNHONOURED)
    assert completion_sampling(CompletionRequest(prompt="Hi", temperature=0.0, **nulls)) == \
        completion_sampling(CompletionRequest(prompt="Hi", temperature=0.0))


@pytest.mark.parametrize(("name", "value"), [("tools", [{"type": "function", "function": {"name": "f"}}]),
                                           ("tool_choice", "required"), ("parallel_tool_calls", False)])
def test_tool_fields_are_refused_on_completions(name, value):
    with pytest.raises(InvalidArgument, match=f"^{name} is not supported on /v1/completions"):
        completion_sampling(CompletionRequest(prompt="Hi", **{name: value}))
    assert completion_sampling(CompletionRequest(prompt="Hi", tools=[], tool_choice="none")) == \
        completion_sampling(CompletionRequest(prompt="Hi"))


CONTROLS = {"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "min_p": 0.05,
            "min_tokens": 4, "logit_bias": {"42": 5, "7": -100}, "allowed_token_ids": [1, 2, 42],
            "bad_words": ["no", " never"], "include_stop_str_in_output": True}


@pytest.mark.parametrize("make", [lambda **kw: chat_sampling(ChatCompletionRequest(messages=MESSAGES, **kw)),
                                  lambda **kw: completion_sampling(CompletionRequest(prompt="Hi", **kw))])
def test_the_controls_reach_the_sampling_params(make):
    p = make(**CONTROLS)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p, p.min_tokens) == \
        (0.5, -0.5, 1.2, 0.05, 4)
    assert p.logit_bias == ((7, -100.0), (42, 5.0)) and p.allowed_token_ids == (1, 2, 42)
    assert p.bad_words == ("no", " never") and p.include_stop_str_in_output
    assert make(**dict.fromkeys(CONTROLS)) == make()  # null = off


@pytest.mark.parametrize(("field", "value"), [
    ("presence_penalty", 2.5), ("presence_penalty", -2.01), ("frequency_penalty", 3), ("repetition_penalty", 0),
    ("repetition_penalty", -1), ("min_p", 1.5), ("min_p", -0.1), ("min_tokens", -1), ("min_tokens", 2**32),
    ("logit_bias", {"x": 1}), ("logit_bias", {"5": 100.5}), ("allowed_token_ids", []), ("bad_words", ["w"] * 129),
])
def test_out_of_bounds_controls_are_refused_by_the_schema_naming_the_field(field, value):
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest(messages=MESSAGES, **{field: value})
    assert err.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(("body", "named"), [
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens must be <= max_tokens"),
    ({"bad_words": ["  "]}, r"bad_words\[0\]"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number"),
])
def test_rules_across_fields_are_refused_by_name(body, named):
    with pytest.raises(InvalidArgument, match=named):
        chat_sampling(ChatCompletionRequest(messages=MESSAGES, **body))


def test_top_logprobs_reach_the_sampling_params_and_need_logprobs():
    assert chat_sampling(ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=20)).top_logprobs == 20
    done = completion_sampling(CompletionRequest(prompt="Hi", logprobs=5))
    assert done.logprobs and done.top_logprobs == 5
    zero = completion_sampling(CompletionRequest(prompt="Hi", logprobs=0))
    assert zero.logprobs and zero.top_logprobs == 0
    with pytest.raises(InvalidArgument, match="top_logprobs needs logprobs"):
        chat_sampling(ChatCompletionRequest(messages=MESSAGES, top_logprobs=2))
    for bad in (21, -1):
        with pytest.raises(ValidationError):
            ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=bad)
        with pytest.raises(ValidationError):
            CompletionRequest(prompt="Hi", logprobs=bad)
