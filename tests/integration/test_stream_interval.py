"""--stream-interval N through both services: the same tokens, text, stop and usage as a stack that streams every
token, in about 1/N of the chunks on the gRPC face and of the events on the HTTP face."""

from __future__ import annotations

import openai
import pytest

from app.launch import start_stack
from clients import SpliceClient
from tests.integration.conftest import MODEL

INTERVAL = 4
NEW = 18


@pytest.fixture(scope="module")
def interval_stack(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0,
                              engine_args=["--max-running-seqs", "4", "--stream-interval", str(INTERVAL)])
    yield engine, pre
    pre.stop()
    engine.stop()


def _chunks(address: str, messages, **kwargs):
    with SpliceClient(address, timeout=120) as client:
        return list(client.chat(messages, temperature=0.0, **kwargs))


def test_the_same_answer_in_fewer_chunks(stack, interval_stack, mixed_messages):
    every = _chunks(stack[1].address, mixed_messages, max_tokens=NEW, ignore_eos=True)
    grouped = _chunks(interval_stack[1].address, mixed_messages, max_tokens=NEW, ignore_eos=True)
    assert [t for c in grouped for t in c.token_ids] == [t for c in every for t in c.token_ids]
    assert "".join(c.text for c in grouped) == "".join(c.text for c in every)
    # (usage's cached_tokens may differ: one stack's prefix cache may hold the prompt from an earlier test)
    counts = [(c[-1].usage.prompt_tokens, c[-1].usage.completion_tokens) for c in (grouped, every)]
    assert counts[0] == counts[1] and grouped[-1].finish_reason == every[-1].finish_reason == "length"
    # after the first chunk, a chunk goes out only with INTERVAL tokens or more (more when a reader lagged), or at
    # the end; the first token alone is not held back (tests/engine/test_engine_handoff.py), though a lagging
    # reader may merge it with the next
    assert all(len(c.token_ids) >= INTERVAL for c in grouped[1:-1])
    assert len(grouped) <= 1 + -(-(NEW - 1) // INTERVAL)


def test_a_stop_string_inside_an_interval_ends_where_it_ends_when_streaming_every_token(stack, interval_stack,
                                                                                      mixed_messages):
    free = _chunks(stack[1].address, mixed_messages, max_tokens=NEW, ignore_eos=True)
    text = "".join(c.text for c in free)
    stop = text[len(text) // 2:len(text) // 2 + 2]  # falls inside some interval of the grouped stream
    assert stop.strip(), f"no usable stop string in {text!r}"
    every = _chunks(stack[1].address, mixed_messages, max_tokens=NEW, ignore_eos=True, stop=[stop])
    grouped = _chunks(interval_stack[1].address, mixed_messages, max_tokens=NEW, ignore_eos=True, stop=[stop])
    assert "".join(c.text for c in grouped) == "".join(c.text for c in every)
    assert [t for c in grouped for t in c.token_ids] == [t for c in every for t in c.token_ids]
    assert grouped[-1].finish_reason == every[-1].finish_reason == "stop"
    assert grouped[-1].stop_reason == every[-1].stop_reason == stop
    assert grouped[-1].usage == every[-1].usage


def test_http_streams_fewer_events_with_the_same_text(interval_stack):
    _, pre = interval_stack
    client = openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key="unused", max_retries=0)
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Say something."}], temperature=0,
                  max_tokens=NEW, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and chunks[-1].usage == whole.usage
    with_content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(with_content) <= 1 + -(-(NEW - 1) // INTERVAL)
