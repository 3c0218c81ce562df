"""n > 1 beside prompt_logprobs and completions echo, through the official `openai` SDK against real processes (vLLM's
shapes): the engine sends a prompt's logprobs once (on choice 0), and the HTTP face shows them on every completions
choice of that prompt (vLLM's serving_completion) and once on a chat response, equal to the n = 1 request's; echo
starts each choice with its prompt (text, and with logprobs its tokens' logprobs), whole and streamed."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clients import SpliceClient
from tests.integration.conftest import API_KEY, MODEL

PROMPTS = ["Once upon a time there was a cat", "The colour red"]
MSGS = [{"role": "user", "content": "Tell me about colours."}]
N = 4  # tokens per choice
SEED = 31
SAMPLED = dict(temperature=1.0, seed=SEED, max_tokens=N)


def _same_prompt_logprobs(got: list, want: list) -> None:
    """Two vLLM prompt_logprobs lists: the same positions, token IDs and ranks, the same logprobs."""
    assert len(got) == len(want) and got[0] is None and want[0] is None
    for g, w in zip(got[1:], want[1:], strict=True):
        assert list(g) == list(w)
        assert [e["rank"] for e in g.values()] == [e["rank"] for e in w.values()]
        assert [e["logprob"] for e in g.values()] == pytest.approx([e["logprob"] for e in w.values()], abs=1e-4)


def test_completions_show_each_prompts_logprobs_on_each_of_its_choices(client):
    extra = {"prompt_logprobs": 2, "ignore_eos": True}
    whole = client.completions.create(model=MODEL, prompt=PROMPTS, n=2, **SAMPLED, extra_body=extra)
    alone = client.completions.create(model=MODEL, prompt=PROMPTS, **SAMPLED, extra_body=extra)  # n = 1
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    for i, choice in enumerate(whole.choices):  # prompt p's choices p x n + j carry prompt p's, as vLLM's
        _same_prompt_logprobs(choice.prompt_logprobs, alone.choices[i // 2].prompt_logprobs)
    assert len(whole.choices[0].prompt_logprobs) + len(whole.choices[2].prompt_logprobs) == \
        whole.usage.prompt_tokens == alone.usage.prompt_tokens  # each prompt counted once
    assert whole.usage.completion_tokens == 4 * N

    chat = client.chat.completions.create(model=MODEL, messages=MSGS, n=2, **SAMPLED, extra_body=extra)
    solo = client.chat.completions.create(model=MODEL, messages=MSGS, **SAMPLED, extra_body=extra)
    assert len(chat.choices) == 2 and chat.usage.prompt_tokens == solo.usage.prompt_tokens
    _same_prompt_logprobs(chat.prompt_logprobs, solo.prompt_logprobs)  # once, on the response


def test_echo_starts_every_choice_with_its_prompt(client):
    base = dict(model=MODEL, prompt=PROMPTS[0], logprobs=1, **SAMPLED, extra_body={"ignore_eos": True})
    whole = client.completions.create(echo=True, n=2, **base)
    one = client.completions.create(echo=True, **base)  # n = 1: choice 0's seed
    second = client.completions.create(echo=True, **{**base, "seed": SEED + 1})  # choice 1's
    prompt_len = one.usage.prompt_tokens
    assert whole.usage.prompt_tokens == prompt_len and whole.usage.completion_tokens == 2 * N
    for choice, want in zip(whole.choices, (one.choices[0], second.choices[0]), strict=True):
        assert choice.text.startswith(PROMPTS[0]) and choice.text == want.text
        lp, want_lp = choice.logprobs, want.logprobs
        assert len(lp.tokens) == prompt_len + N and lp.tokens == want_lp.tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the prompt's first token
        assert lp.token_logprobs[1:] == pytest.approx(want_lp.token_logprobs[1:], abs=1e-4)
        assert lp.text_offset == want_lp.text_offset
        _same_prompt_logprobs(choice.prompt_logprobs, one.choices[0].prompt_logprobs)  # (echo implies them)

    stream = list(client.completions.create(echo=True, n=2, stream=True, **base))
    text: dict[int, str] = defaultdict(str)
    tokens: dict[int, list[str]] = defaultdict(list)
    firsts: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            firsts.setdefault(c.index, c.text)
            text[c.index] += c.text
            tokens[c.index] += c.logprobs.tokens if c.logprobs else []
    assert all(firsts[i].startswith(PROMPTS[0]) for i in range(2))  # each choice's first chunk: the prompt, as vLLM's
    assert dict(text) == {c.index: c.text for c in whole.choices}
    assert dict(tokens) == {c.index: c.logprobs.tokens for c in whole.choices}

    only = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=0, echo=True, n=2)
    assert [c.text for c in only.choices] == [PROMPTS[0]] * 2  # max_tokens 0: the prompt alone, per choice


def test_grpc_sends_the_prompt_logprobs_once_on_choice_0(http_stack):
    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as grpc_client:
        chunks = list(grpc_client.complete([PROMPTS[0]], n=3, temperature=1.0, seed=SEED, max_tokens=N,
                                           prompt_logprobs=1, ignore_eos=True))
        alone = list(grpc_client.complete([PROMPTS[0]], temperature=1.0, seed=SEED, max_tokens=N, prompt_logprobs=1,
                                          ignore_eos=True))
    carrying = [c for c in chunks if c.prompt_logprobs is not None]
    assert [c.index for c in carrying] == [0]
    assert sorted(c.index for c in chunks if c.finish_reason) == [0, 1, 2]
    got, want = carrying[0].prompt_logprobs, alone[0].prompt_logprobs
    assert got.token_ids == want.token_ids
    assert [e[1] for e in got.entries()[1:]] == pytest.approx([e[1] for e in want.entries()[1:]], abs=1e-4)

