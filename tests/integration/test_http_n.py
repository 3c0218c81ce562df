"""n > 1 choices from one prompt, through the official `openai` SDK against real processes (vLLM's semantics): choices
0..n-1 (a completions batch's prompt p choice j at p x n + j), streamed chunks tagged by choice, each choice ending with
its own finish_reason, usage with the prompt once and every choice's tokens, choice i of a seeded request equal to a
request of n = 1 with seed + i; the prompt prefilled once (the engine's prompt-token counter); a cancelled stream frees
every choice (the engine's running gauge back to 0); n out of range a 400 naming n."""

from __future__ import annotations

import time
from collections import defaultdict

import openai
import pytest

from app.scrape import Samples, scrape, value
from clients import SpliceClient
from tests.integration.conftest import API_KEY, MODEL

MSGS = [{"role": "user", "content": "Tell me about colours."}]
N = 6  # tokens per choice
SEED = 77
SAMPLED = dict(temperature=1.0, seed=SEED, max_tokens=N, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def engine_metrics(http_stack):
    return http_stack[0]


def _seeded(i: int, **kwargs) -> dict:
    return {**SAMPLED, **kwargs, "seed": SEED + i}


def _settle(engine, done, timeout: float = 30.0) -> Samples:
    """Scrapes until `done` holds (the engine thread records a step's counters just after the step's outputs)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(engine)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def _streamed_by_choice(chunks) -> tuple[dict[int, str], dict[int, list[str]], object]:
    """(text per choice, finish reasons per choice, the usage) of a chat or completions stream."""
    text: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    usage = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text[choice.index] += piece or ""
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    return dict(text), dict(finishes), usage


def test_chat_choices_equal_solo_requests_seeded_whole_and_streamed(client):
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, **SAMPLED)
    solo = [client.chat.completions.create(model=MODEL, messages=MSGS, **_seeded(i)) for i in range(3)]
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.message.content for c in whole.choices] == [s.choices[0].message.content for s in solo]
    assert len({c.message.content for c in whole.choices}) > 1  # the choices differ
    assert all(c.finish_reason == "length" and c.message.role == "assistant" for c in whole.choices)
    prompt = solo[0].usage.prompt_tokens
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == \
        (prompt, 3 * N, prompt + 3 * N)  # the prompt once, every choice's tokens

    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, n=3, stream=True,
                                                 stream_options={"include_usage": True}, **SAMPLED))
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == [0, 1, 2]  # the stream opens every choice with its role, as vLLM's
    text, finishes, usage = _streamed_by_choice(chunks)
    assert text == {i: c.message.content for i, c in enumerate(whole.choices)}
    assert finishes == {i: ["length"] for i in range(3)}  # each choice ends once, with its own reason
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, 3 * N)


def test_completions_batch_numbers_prompt_p_choice_j_as_p_times_n_plus_j(client):
    prompts = ["Once upon", "The colour red"]
    whole = client.completions.create(model=MODEL, prompt=prompts, n=2, **SAMPLED)
    solo = {(p, j): client.completions.create(model=MODEL, prompt=prompts[p], **_seeded(j))
            for p in range(2) for j in range(2)}
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == [solo[p, j].choices[0].text for p in range(2) for j in range(2)]
    prompt_tokens = solo[0, 0].usage.prompt_tokens + solo[1, 0].usage.prompt_tokens  # each prompt once
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt_tokens, 4 * N)

    chunks = list(client.completions.create(model=MODEL, prompt=prompts, n=2, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED))
    text, finishes, usage = _streamed_by_choice(chunks)
    assert text == {c.index: c.text for c in whole.choices}
    assert finishes == {i: ["length"] for i in range(4)}
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, 4 * N)
    # each choice names its own prompt's IDs (return_token_ids)
    ids = client.completions.create(model=MODEL, prompt=prompts, n=2, **{**SAMPLED, "extra_body": {
        "ignore_eos": True, "return_token_ids": True}})
    prompt_ids = [c.model_extra["prompt_token_ids"] for c in ids.choices]
    assert prompt_ids[0] == prompt_ids[1] != prompt_ids[2] == prompt_ids[3]
    assert len(prompt_ids[0]) + len(prompt_ids[2]) == prompt_tokens


def test_choices_with_logprobs_equal_their_solo_requests(client):
    kwargs = dict(logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, n=2, **SAMPLED, **kwargs)
    for i, choice in enumerate(whole.choices):
        alone = client.chat.completions.create(model=MODEL, messages=MSGS, **_seeded(i), **kwargs).choices[0]
        got, want = choice.logprobs.content, alone.logprobs.content
        assert len(got) == N and [t.token for t in got] == [t.token for t in want]
        assert [t.logprob for t in got] == pytest.approx([t.logprob for t in want], abs=1e-4)
        assert all(len(t.top_logprobs) == 2 for t in got)
    done = client.completions.create(model=MODEL, prompt="Once upon", n=2, logprobs=1, **SAMPLED)
    assert [len(c.logprobs.tokens) for c in done.choices] == [N, N]


def test_each_choice_stops_at_its_own_stop_string(client):
    plain = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, **{**SAMPLED, "max_tokens": 12})
    # a stop string from inside choice 1's answer: choice 1 ends there, the others where their own text has it
    text = plain.choices[1].message.content
    stop = text[len(text) // 3:len(text) // 3 + 2]
    assert stop.strip()
    got = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, stop=[stop], **{**SAMPLED, "max_tokens": 12})
    for i, choice in enumerate(got.choices):
        alone = client.chat.completions.create(model=MODEL, messages=MSGS, stop=[stop],
                                               **_seeded(i, max_tokens=12)).choices[0]
        assert (choice.message.content, choice.finish_reason) == (alone.message.content, alone.finish_reason)
    assert got.choices[1].finish_reason == "stop" and got.choices[1].message.content == text[:text.index(stop)]
    # (without the stop string, choice 1 went on: its later tokens were not counted)
    assert got.usage.completion_tokens < plain.usage.completion_tokens


def test_the_prompt_is_prefilled_once_for_all_choices(client, engine_metrics):
    before = scrape(engine_metrics)
    reply = client.chat.completions.create(model=MODEL, messages=MSGS, n=4, **SAMPLED)
    assert reply.usage.completion_tokens == 4 * N

    def delta(samples: Samples, name: str) -> float:
        return value(samples, name) - value(before, name)

    after = _settle(engine_metrics, lambda s: delta(s, "splice_engine_generation_tokens_total") >= 4 * N)
    assert delta(after, "splice_engine_generation_tokens_total") == 4 * N
    assert delta(after, "splice_engine_prompt_tokens_total") == reply.usage.prompt_tokens  # once, not 4 times
    assert delta(after, "splice_engine_prefill_batch_size_count") == 1


def test_a_cancelled_stream_frees_every_choice(client, engine_metrics):
    finished = "splice_engine_requests_finished_total"
    before = scrape(engine_metrics)
    stream = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, stream=True, temperature=1.0,
                                            max_tokens=2000, extra_body={"ignore_eos": True})
    seen: set[int] = set()
    for chunk in stream:  # until every choice is streaming
        seen |= {c.index for c in chunk.choices if c.delta.content}
        if seen == {0, 1, 2}:
            break
    running = scrape(engine_metrics)
    assert value(running, "splice_engine_num_requests_running") == 3
    stream.close()
    after = _settle(engine_metrics, lambda s: value(s, finished, finish_reason="abort")
                    - value(before, finished, finish_reason="abort") >= 3
                    and value(s, "splice_engine_num_requests_running") == 0)
    assert value(after, finished, finish_reason="abort") - value(before, finished, finish_reason="abort") == 3
    assert value(after, "splice_engine_num_requests_running") == 0
    assert client.chat.completions.create(model=MODEL, messages=MSGS, n=2, **SAMPLED).usage.completion_tokens == 2 * N


@pytest.mark.parametrize(("n", "needles"), [(0, ["n must be in [1, 128]"]), (129, ["n must be in [1, 128]"]),
                                            (5, ["n is 5", "--max-running-seqs"])])  # the stack runs 4 at most
def test_n_out_of_range_is_a_400_naming_n(client, n, needles):
    for create in (lambda: client.chat.completions.create(model=MODEL, messages=MSGS, n=n, max_tokens=2),
                   lambda: client.completions.create(model=MODEL, prompt="Hi", n=n, max_tokens=2),
                   lambda: client.chat.completions.create(model=MODEL, messages=MSGS, n=n, max_tokens=2,
                                                          stream=True)):
        with pytest.raises(openai.BadRequestError) as bad:
            create()
        assert all(needle in bad.value.message for needle in needles), bad.value.message
    assert client.chat.completions.create(model=MODEL, messages=MSGS, n=4, **SAMPLED).usage.completion_tokens == 4 * N


def test_best_of_is_served_only_where_it_equals_n(client):
    reply = client.completions.create(model=MODEL, prompt="Once upon", n=2, best_of=2, **SAMPLED)
    assert len(reply.choices) == 2
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model=MODEL, prompt="Once upon", n=2, best_of=3, **SAMPLED)


def test_the_grpc_client_streams_each_choice_with_its_index(client, http_stack):
    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as grpc_client:
        chunks = list(grpc_client.chat(MSGS, n=3, temperature=1.0, seed=SEED, max_tokens=N, ignore_eos=True))
    text: dict[int, str] = defaultdict(str)
    for c in chunks:
        text[c.index] += c.text
    assert sorted(c.index for c in chunks if c.finish_reason) == [0, 1, 2]
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, **SAMPLED)
    assert dict(text) == {c.index: c.message.content for c in whole.choices}
