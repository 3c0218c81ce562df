"""The HTTP face refuses sampling and output controls it does not implement (400 naming the field) instead of
serving the request without them; their "off" values, which clients send by default, are accepted."""

from __future__ import annotations

import pytest

from preprocessor.http.convert import UNHONOURED, chat_sampling, completion_sampling
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest
from splice.errors import InvalidArgument

ASKING = {  # a value of each field that asks for something
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 4,
    "length_penalty": 0.8, "best_of": 2, "use_beam_search": True, "logit_bias": {"42": 5},
    "bad_words": ["no"], "allowed_token_ids": [1, 2], "include_stop_str_in_output": True,
    "spaces_between_special_tokens": False, "prompt_logprobs": 1, "truncate_prompt_tokens": 8,
    "logits_processors": ["x"], "response_format": {"type": "json_object"},
    "structured_outputs": {"json": {}}, "guided_json": {"type": "object"}, "guided_regex": "a+",
    "guided_choice": ["a", "b"], "guided_grammar": "root ::= 'a'",
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
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
    assert off["logit_bias"] == {} and off["response_format"] == {"type": "text"} and off["tools"] == []
    plain = chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0))
    assert chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0, **off)) == plain
    assert chat_sampling(ChatCompletionRequest(messages=MESSAGES, temperature=0.0, tool_choice="auto",
                                               presence_penalty=0.0, repetition_penalty=1.0)) == plain
    nulls = dict.fromkeys(UNHONOURED)
    assert completion_sampling(CompletionRequest(prompt="Hi", temperature=0.0, **nulls)) == \
        completion_sampling(CompletionRequest(prompt="Hi", temperature=0.0))
