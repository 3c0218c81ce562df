"""Penalties and masks end to end: through the official `openai` SDK against real processes, each answer the same
as the gRPC client's (whose token IDs show what the engine did), and every out-of-range value a 400 naming it."""

from __future__ import annotations

import openai
import pytest
from transformers import AutoTokenizer

from preprocessor.bad_words import bad_words_token_ids
from tests.integration.conftest import MODEL

MSGS = [{"role": "user", "content": "Tell me about colours."}]
N = 10


def _both(client, grpc_client, **controls) -> tuple[list[int], str, object]:
    """(the gRPC answer's token IDs, its text, the HTTP choice); the two answers' texts must be equal."""
    chunks = list(grpc_client.chat(MSGS, temperature=0.0, max_tokens=N, **controls))
    ids = [t for c in chunks for t in c.token_ids]
    text = "".join(c.text for c in chunks)
    reply = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=N,
                                           extra_body=controls)
    assert reply.choices[0].message.content == text
    assert reply.usage.completion_tokens == len(ids)
    return ids, text, reply.choices[0]


def test_logit_bias_forces_eos_and_min_tokens_holds_it_back(client, grpc_client):
    eos = grpc_client.model_info().eos_token_ids[0]
    ids, _, choice = _both(client, grpc_client, logit_bias={eos: 100})
    assert ids == [eos] and choice.finish_reason == "stop"
    ids, _, choice = _both(client, grpc_client, logit_bias={eos: 100}, min_tokens=5)
    assert len(ids) == 6 and ids[-1] == eos and eos not in ids[:5] and choice.finish_reason == "stop"
    # on completions too, the SDK's own logit_bias argument (keys as strings on the wire)
    done = client.completions.create(model=MODEL, prompt="Once upon", temperature=0, max_tokens=N,
                                     logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    assert done.usage.completion_tokens == 4 and done.choices[0].finish_reason == "stop"


def test_allowed_token_ids_and_bad_words(client, grpc_client, model_dir):
    plain, _, _ = _both(client, grpc_client, ignore_eos=True)
    allowed = sorted(set(plain[1:4]))
    ids, _, _ = _both(client, grpc_client, ignore_eos=True, allowed_token_ids=allowed)
    assert set(ids) <= set(allowed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    word = tok.decode([plain[0]]).strip() or tok.decode([plain[1]]).strip()
    banned = bad_words_token_ids([word], tok, _NoSentinels())
    ids, _, _ = _both(client, grpc_client, ignore_eos=True, bad_words=[word])
    for seq in banned:  # no banned sequence appears anywhere in the answer
        assert not any(tuple(ids[i:i + len(seq)]) == seq for i in range(len(ids))), (word, seq, ids)
    assert ids != plain


def test_penalties_change_the_answer_the_same_on_both_faces(client, grpc_client):
    plain, _, _ = _both(client, grpc_client, ignore_eos=True)
    penalized, _, _ = _both(client, grpc_client, ignore_eos=True, repetition_penalty=1.6, frequency_penalty=1.0,
                            presence_penalty=0.5)
    assert penalized != plain


def test_min_p_of_one_samples_the_greedy_answer(client):
    greedy = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=N,
                                            extra_body={"ignore_eos": True}).choices[0].message.content
    sampled = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=5, max_tokens=N,
                                             extra_body={"ignore_eos": True, "min_p": 1.0})
    assert sampled.choices[0].message.content == greedy


def test_include_stop_str_in_output_and_stop_strings_after_min_tokens(client):
    base = dict(model=MODEL, messages=MSGS, temperature=0, max_tokens=N)
    text = client.chat.completions.create(extra_body={"ignore_eos": True}, **base).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 2]
    at = text.index(stop)
    kept = client.chat.completions.create(stop=[stop], extra_body={"ignore_eos": True,
                                                                   "include_stop_str_in_output": True}, **base)
    assert kept.choices[0].message.content == text[:at + len(stop)] and kept.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(stop=[stop], stream=True, extra_body={
        "ignore_eos": True, "include_stop_str_in_output": True}, **base)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[:at + len(stop)]
    # min_tokens == max_tokens: no stop string is looked for (vLLM looks only past min_tokens)
    late = client.chat.completions.create(stop=[stop], extra_body={"ignore_eos": True, "min_tokens": N}, **base)
    assert late.choices[0].message.content == text and late.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("field", "value"), [
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0), ("min_p", 1.5),
    ("min_tokens", -1), ("min_tokens", 2**32), ("logit_bias", {"5": 101}), ("logit_bias", {"five": 1}),
    ("allowed_token_ids", []), ("bad_words", [""]),
])
def test_out_of_range_controls_are_400_naming_the_field(client, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, extra_body={field: value})
    assert err.value.status_code == 400 and field in err.value.message


@pytest.mark.parametrize("field", ["logit_bias", "allowed_token_ids"])
def test_token_ids_past_the_vocabulary_are_400_naming_the_id(client, grpc_client, field):
    bad = grpc_client.model_info().vocab_rows + 7
    value = {str(bad): 1.0} if field == "logit_bias" else [3, bad]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={field: value})
    assert f"{field}: token ID {bad}" in err.value.message


def test_min_tokens_above_max_tokens_is_400(client):
    with pytest.raises(openai.BadRequestError, match="min_tokens must be <= max_tokens"):
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, extra_body={"min_tokens": 3})


class _NoSentinels:
    """The test's tokenizer has no sentinels to refuse (the words come from the model's own output)."""

    @staticmethod
    def check_text(text: str, where: object, what: str = "text") -> None:
        pass


def test_chat_top_logprobs_are_the_most_likely_alternatives_as_on_grpc(client, grpc_client):
    k = 5
    reply = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=N, logprobs=True,
                                           top_logprobs=k, extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == N
    for item in content:
        alternatives = [a.logprob for a in item.top_logprobs]
        assert len(alternatives) == k and alternatives == sorted(alternatives, reverse=True)
        assert item.top_logprobs[0].token == item.token and item.top_logprobs[0].logprob == item.logprob  # greedy
    chunks = list(grpc_client.chat(MSGS, temperature=0.0, max_tokens=N, ignore_eos=True, logprobs=True,
                                   top_logprobs=k))
    tops = [top for c in chunks for top in c.top_logprobs]
    assert [[lp for _, lp in top] for top in tops] == [[a.logprob for a in i.top_logprobs] for i in content]
    streamed = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=N, logprobs=True,
                                              top_logprobs=k, stream=True, extra_body={"ignore_eos": True})
    items = [i for c in streamed if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content]
    assert [i.model_dump() for i in items] == [i.model_dump() for i in content]


def test_completions_logprobs_n_map_the_chosen_and_the_n_most_likely(client):
    done = client.completions.create(model=MODEL, prompt="Once upon", temperature=0.9, seed=3, max_tokens=N,
                                     logprobs=3, extra_body={"ignore_eos": True})
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.top_logprobs) == N
    assert sum(len(top) >= 3 for top in lp.top_logprobs) > N // 2
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        # vLLM's N, or N + 1 when the draw was not among them (fewer when two share a text: the chosen one's kept)
        assert top[token] == chosen and 1 <= len(top) <= 4
        assert max(top.values()) >= chosen


def test_top_logprobs_out_of_range_or_without_logprobs_are_400(client):
    for body in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}):
        with pytest.raises(openai.BadRequestError, match="top_logprobs"):
            client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, **body)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=21)
