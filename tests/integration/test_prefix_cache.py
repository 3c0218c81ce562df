"""The prefix cache through real processes on loopback, as users meet it: a shared system prompt is read from the
cache in whole blocks and answers as uncached (the same tokens, the same logprobs); POST /reset_prefix_cache forgets
it; a different picture or different prompt-embeds rows behind the same token IDs hit only the blocks before them
(the trained colours VLM names each request's own colour); cache_salt separates tenants; prompt_logprobs requests
read no block; concurrent and cancelled streams over a cached prefix give their solo answers; the smallest budget
(1 MiB: 128 of tiny-text's blocks) evicts the least recently used, the tail of a chain before its head, and never
holds more than it pays for. Counts are the engine's /metrics, read between requests (nothing else runs)."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from app.demo import embedding_rows, vllm_base64
from app.launch import Service, start_stack
from app.scrape import Samples, scrape, value
from app.tiny import DEFAULT_MODEL, colors
from clients import SpliceClient
from preprocessor.sentinel import FILLER_ID
from tests.integration.conftest import API_KEY

TEXT = "tiny-text"
BLOCK = 16  # the engine's --block-size default (vLLM's)
SYSTEM = " ".join(f"Rule {i}: answer briefly, politely and only about the question asked." for i in range(10))
LOGPROB_TOLERANCE = 1e-4  # cached vs uncached differ by <= 5e-7 here; a wrong block moves them by 1e-3 and more
QUESTIONS = ["What is the weather like?", "Name a fruit.", "Count to three.", "Say hello.", "Where is the sea?",
             "Tell a joke.", "Which day is it?", "Spell cat."]


@dataclass(frozen=True)
class Face:
    """A running stack and the openai SDK on its HTTP face."""

    engine: Service
    pre: Service
    sdk: openai.OpenAI
    model: str


@contextmanager
def _stack(model: str, *engine_args: str):
    """Engine (with /metrics) + preprocessor with the HTTP face behind the API key, as users run it."""
    with mock.patch.dict(os.environ, {"SPLICE_API_KEY": API_KEY}):
        engine, pre = start_stack(model, http_port=0, engine_args=["--metrics-port", "0", *engine_args])
    try:
        with openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key=API_KEY, timeout=120,
                           max_retries=0) as sdk:
            yield Face(engine, pre, sdk, model)
    finally:
        pre.stop()
        engine.stop()


@pytest.fixture(scope="module")
def text_stack(tiny_dirs):
    with _stack(TEXT, "--max-running-seqs", "8") as s:
        yield s


@dataclass(frozen=True)
class Counts:
    queries: float
    hits: float
    blocks: float


def _counts(face: Face) -> Counts:
    samples = scrape(face.engine)
    return Counts(value(samples, "splice_engine_prefix_cache_queries_total"),
                  value(samples, "splice_engine_prefix_cache_hits_total"),
                  value(samples, "splice_engine_prefix_cache_blocks"))


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_ids: list[int]
    hits: float  # prompt positions the engine read from the cache for this request
    queries: float  # prompt positions it looked up
    blocks: float  # the blocks gauge after it
    reply: object
    token_ids: list[int]
    logprobs: list[float]  # of each generated token: any difference in the key/value columns read moves them


def _ask(face: Face, messages: list[dict], max_tokens: int = 8, **extra) -> Answer:
    """One greedy chat (nothing else runs on the engine), with the prefix-cache counters it moved."""
    before = _counts(face)
    reply = face.sdk.chat.completions.create(model=face.model, messages=messages, temperature=0,
                                             max_tokens=max_tokens, logprobs=True,
                                             extra_body={"ignore_eos": True, "return_token_ids": True, **extra})
    after = _counts(face)
    choice = reply.choices[0]
    return Answer(choice.message.content, reply.model_extra["prompt_token_ids"], after.hits - before.hits,
                  after.queries - before.queries, after.blocks, reply, choice.model_extra["token_ids"],
                  [t.logprob for t in choice.logprobs.content])


def _same(got: Answer | tuple[list[int], list[float]], want: Answer) -> bool:
    """The same greedy tokens with the same logprobs (to float noise: a hit prefills the rest of the prompt in
    other shapes than a whole prefill does)."""
    ids, logprobs = (got.token_ids, got.logprobs) if isinstance(got, Answer) else got
    return ids == want.token_ids and logprobs == pytest.approx(want.logprobs, abs=LOGPROB_TOLERANCE)


def _reset(face: Face) -> None:
    """POST /reset_prefix_cache: its 200 comes once every replica forgot its blocks."""
    r = httpx.post(f"http://{face.pre.http_address}/reset_prefix_cache",
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 200 and r.content == b"", r.text


def _whole(prompt_len: int) -> int:
    """Positions a full hit reads: whole blocks, never the prompt's last position (its logits are needed)."""
    return (prompt_len - 1) // BLOCK * BLOCK


def _held(a: Answer) -> int:
    """Blocks a request that ended normally leaves: whole blocks of its prompt and its generated tokens but the last
    (whose keys and values were never computed)."""
    return (len(a.prompt_ids) + len(a.token_ids) - 1) // BLOCK


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _chat(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


# --- tiny-text over the openai SDK -----------------------------------------------------------------------------


def test_a_shared_system_prompt_hits_whole_blocks_and_reset_forgets_them(text_stack):
    _reset(text_stack)
    first = _ask(text_stack, _chat(QUESTIONS[0]))
    n = len(first.prompt_ids)
    assert first.hits == 0 and first.queries == n and n > 8 * BLOCK
    # the gauge counts the blocks it left (its prompt's and its generated tokens', the last one's keys never
    # computed), without waiting for another request
    assert first.blocks == _held(first)
    again = _ask(text_stack, _chat(QUESTIONS[0]))
    assert _same(again, first)
    assert again.hits == _whole(n) and again.queries == n
    other = _ask(text_stack, _chat(QUESTIONS[1]))  # the same system prompt, another question
    shared = _common(first.prompt_ids, other.prompt_ids)
    assert shared >= 8 * BLOCK and other.hits == min(shared // BLOCK * BLOCK, _whole(len(other.prompt_ids)))

    _reset(text_stack)
    after_reset = _ask(text_stack, _chat(QUESTIONS[0]))
    assert after_reset.hits == 0 and _same(after_reset, first)
    _reset(text_stack)
    uncached_other = _ask(text_stack, _chat(QUESTIONS[1]))
    assert uncached_other.hits == 0 and _same(other, uncached_other)


def test_cache_salt_shares_blocks_only_within_one_salt(text_stack):
    msgs = _chat(QUESTIONS[2])
    _reset(text_stack)
    salted = [_ask(text_stack, msgs, cache_salt=s) for s in ("tenant-a", "tenant-b")]
    unsalted = _ask(text_stack, msgs)
    same_salt = _ask(text_stack, msgs, cache_salt="tenant-a")
    assert [a.hits for a in salted] == [0, 0] and unsalted.hits == 0
    assert same_salt.hits == _whole(len(same_salt.prompt_ids)) > 0
    assert all(_same(a, unsalted) for a in [*salted, same_salt])

    # the gRPC face's SamplingParams.cache_salt keys the same way: a new salt misses, then hits
    with SpliceClient(text_stack.pre.address, timeout=60, api_key=API_KEY) as grpc_client:
        def grpc_hits() -> float:
            before = _counts(text_stack).hits
            list(grpc_client.chat(msgs, temperature=0.0, max_tokens=2, cache_salt="tenant-c"))
            return _counts(text_stack).hits - before

        assert grpc_hits() == 0
        assert grpc_hits() > 0


def test_prompt_logprobs_read_no_block_and_equal_the_uncached_ones(text_stack):
    msgs = _chat(QUESTIONS[3])
    _reset(text_stack)
    uncached = _ask(text_stack, msgs, prompt_logprobs=1)
    plain = _ask(text_stack, msgs)  # the prompt's blocks are in the cache: a plain request hits them
    assert plain.hits == _whole(len(plain.prompt_ids)) > 0
    cached = _ask(text_stack, msgs, prompt_logprobs=1)
    assert cached.hits == 0 and cached.queries == len(plain.prompt_ids)
    want, got = uncached.reply.model_extra["prompt_logprobs"], cached.reply.model_extra["prompt_logprobs"]
    assert len(got) == len(plain.prompt_ids) and got[0] is None
    assert got == want and _same(cached, uncached) and _same(plain, uncached)


def test_concurrent_streams_over_a_cached_prefix_give_their_solo_answers(text_stack):
    solo = []
    for q in QUESTIONS:  # one at a time, each uncached
        _reset(text_stack)
        solo.append(_ask(text_stack, _chat(q)))
    _reset(text_stack)
    warm = _ask(text_stack, _chat("Introduce yourself."))  # caches the shared system prompt
    assert all(a.hits == 0 for a in [*solo, warm])
    # every pair of prompts parts in the same block: each stream reads the same blocks, whichever stored first
    ids = [a.prompt_ids for a in [*solo, warm]]
    parted = {_common(a, b) // BLOCK for i, a in enumerate(ids) for b in ids[i + 1:]}
    assert len(parted) == 1 and (shared := parted.pop() * BLOCK) >= 8 * BLOCK
    before = _counts(text_stack)
    gate = threading.Barrier(len(QUESTIONS))
    got: dict[int, tuple[list[int], list[float]]] = {}

    def one(i: int) -> None:
        gate.wait(60)
        stream = text_stack.sdk.chat.completions.create(
            model=TEXT, messages=_chat(QUESTIONS[i]), stream=True, temperature=0, max_tokens=8, logprobs=True,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        ids, logprobs = [], []
        for chunk in stream:
            if chunk.choices:
                ids += chunk.choices[0].model_extra.get("token_ids") or []
                logprobs += [t.logprob for t in (chunk.choices[0].logprobs.content or [])] \
                    if chunk.choices[0].logprobs else []
        got[i] = ids, logprobs

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    after = _counts(text_stack)
    assert sorted(got) == list(range(len(QUESTIONS)))
    assert all(_same(got[i], solo[i]) for i in range(len(QUESTIONS))), (got, solo)
    # each read exactly the shared system prompt's blocks (their own blocks start where the questions differ)
    assert after.hits - before.hits == sum(min(shared, _whole(len(a.prompt_ids))) for a in solo)


def _running(samples: Samples) -> float:
    return value(samples, "splice_engine_num_requests_running")


def _aborted(samples: Samples) -> float:
    return value(samples, "splice_engine_requests_finished_total", finish_reason="abort")


def _length(samples: Samples) -> float:
    return value(samples, "splice_engine_requests_finished_total", finish_reason="length")


def _wait_for(engine: Service, done, timeout: float = 90.0) -> Samples:
    """Polls the engine's metrics until `done(samples)` (a generous deadline: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(engine)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_a_cancelled_stream_over_a_cached_prefix_frees_its_slot_and_the_cache_still_answers(text_stack):
    _reset(text_stack)
    solo = _ask(text_stack, _chat(QUESTIONS[4]))  # uncached; leaves its blocks in the cache
    for _ in range(3):  # a stream that ended before its close (a stalled test process) is tried again
        before = scrape(text_stack.engine)
        stream = text_stack.sdk.chat.completions.create(model=TEXT, messages=_chat(QUESTIONS[4]), stream=True,
                                                        temperature=0, max_tokens=1500,
                                                        extra_body={"ignore_eos": True})
        next(iter(stream))  # the first event follows the engine's first token: the prompt was looked up and ran
        # closed at once: the SDK drops the connection, the preprocessor cancels, the engine aborts the sequence
        stream.close()
        after = _wait_for(text_stack.engine, lambda s, b=before: _running(s) == 0 and (
            _aborted(s) > _aborted(b) or _length(s) > _length(b)))
        if _aborted(after) > _aborted(before):
            break
    assert _running(after) == 0 and _aborted(after) == _aborted(before) + 1
    assert value(after, "splice_engine_prefix_cache_hits_total") - \
        value(before, "splice_engine_prefix_cache_hits_total") == _whole(len(solo.prompt_ids))
    repeat = _ask(text_stack, _chat(QUESTIONS[4]))
    assert repeat.hits == _whole(len(repeat.prompt_ids)) and _same(repeat, solo)


# --- eviction: the smallest budget ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_stack(tiny_dirs):
    with _stack(TEXT, "--prefix-cache-mb", "1") as s:
        yield s


def _capacity(model_dir) -> int:
    """Blocks 1 MiB holds: per block, every layer's keys and values (float32) of BLOCK positions."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_block = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4 * 2 * BLOCK
    return (1 << 20) // per_block


def _story(seed: int, words: int = 280) -> list[dict]:
    rng = random.Random(seed)
    vocab = ["cat", "dog", "sea", "red", "blue", "tree", "rain", "sun", "road", "book", "milk", "star", "door"]
    return [{"role": "user", "content": f"Story {seed}: " + " ".join(rng.choice(vocab) for _ in range(words))}]


def test_a_tiny_budget_evicts_the_least_recently_used_tails_and_answers_stay_uncached(small_stack, tiny_dirs):
    capacity = _capacity(tiny_dirs[TEXT])  # tiny-text: 2 layers x 2 kv heads x 16 x 4 B x 2 x 16 = 8 KiB: 128
    prompts = [_story(k) for k in range(3)]
    uncached = []
    for p in prompts:
        _reset(small_stack)
        uncached.append(_ask(small_stack, p))
    held = [_held(a) for a in uncached]  # the blocks each request leaves in the cache
    prompt_blocks = len(uncached[0].prompt_ids) // BLOCK  # of those, the first prompt's (its generated ones come later)
    # two fit; the third makes room by evicting from the first (the least recently used: its prompt's tail first)
    assert held[0] + held[1] <= capacity < sum(held) < capacity + prompt_blocks, (held, capacity)
    _reset(small_stack)
    seen = [_ask(small_stack, p) for p in prompts]
    first_again = _ask(small_stack, prompts[0])  # its head is left: the tail went first
    last_again = _ask(small_stack, prompts[2])  # the most recently used: whole
    assert [a.hits for a in seen] == [0, 0, 0]
    evicted = sum(held) - capacity
    assert first_again.hits == min(prompt_blocks - evicted, _whole(len(uncached[0].prompt_ids)) // BLOCK) * BLOCK > 0
    assert last_again.hits == _whole(len(uncached[2].prompt_ids))
    assert all(_same(a, b) for a, b in zip([*seen, first_again, last_again], [*uncached, uncached[0], uncached[2]],
                                           strict=True))
    gauge = [a.blocks for a in [*seen, first_again, last_again]]
    assert max(gauge) == capacity, gauge  # filled up, never past what the budget pays for


# --- the trained colours VLM: pictures and prompt-embeds rows behind the same IDs ------------------------------


SIZE = (64, 48)
COLOUR_TOKENS = 16


@pytest.fixture(scope="module")
def colors_stack(tiny_dirs):
    with _stack(DEFAULT_MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def colors_dir(tiny_dirs):
    return tiny_dirs[DEFAULT_MODEL]


def _image_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _favorite_rows(colors_dir, favorite: str):
    tok = AutoTokenizer.from_pretrained(colors_dir)
    ids = tok(colors.favorite_sentence("The color is {c}.", favorite), add_special_tokens=False).input_ids
    return embedding_rows(colors_dir, ids)


def _colour_chat(picture, favorite) -> list[dict]:
    """The demo's conversation with a system prompt; `favorite`: a colour name (as text) or its embedding rows."""
    fav = {"type": "text", "text": colors.favorite_sentence("The color is {c}.", favorite)} \
        if isinstance(favorite, str) else {"type": "prompt_embeds", "data": vllm_base64(favorite)}
    return [{"role": "system", "content": colors.SYSTEM}, {"role": "user", "content": [
        {"type": "text", "text": colors.DEMO_PREFACE}, fav,
        {"type": "image_url", "image_url": {"url": _image_url(picture)}},
        {"type": "text", "text": colors.DEMO_QUESTION}]}]


def _pictures() -> dict:
    """A red and a blue picture of one size: the same placeholder IDs."""
    rng = random.Random(5)
    return {c: colors.picture(c, rng).resize(SIZE) for c in ("red", "blue")}


def _image_token_id(colors_dir) -> int:
    with open(os.path.join(colors_dir, "config.json")) as f:
        return json.load(f)["image_token_id"]


def _ask_colours(face: Face, messages: list[dict]) -> Answer:
    return _ask(face, messages, COLOUR_TOKENS, ignore_eos=False)


def test_a_different_picture_behind_the_same_ids_hits_only_the_blocks_before_it(colors_stack, colors_dir):
    _reset(colors_stack)
    pictures = _pictures()
    red = _ask_colours(colors_stack, _colour_chat(pictures["red"], "green"))
    blue = _ask_colours(colors_stack, _colour_chat(pictures["blue"], "green"))  # red's blocks are cached
    red_again = _ask_colours(colors_stack, _colour_chat(pictures["red"], "green"))
    assert blue.prompt_ids == red.prompt_ids  # only the pixels differ
    first_image = red.prompt_ids.index(_image_token_id(colors_dir))
    assert red.hits == 0 and blue.hits == first_image // BLOCK * BLOCK
    assert red_again.hits == _whole(len(red.prompt_ids)) > blue.hits  # the same picture: a full hit
    assert _same(red_again, red)
    assert [colors.read_answer(a.text) for a in (red, blue, red_again)] == \
        [("red", "green"), ("blue", "green"), ("red", "green")]


def test_different_embeds_rows_behind_the_same_ids_hit_only_the_blocks_before_them(colors_stack, colors_dir):
    _reset(colors_stack)
    picture = _pictures()["blue"]
    purple, green = _favorite_rows(colors_dir, "purple"), _favorite_rows(colors_dir, "green")
    assert purple.shape == green.shape  # one token each: the same filler IDs
    first = _ask_colours(colors_stack, _colour_chat(picture, purple))
    second = _ask_colours(colors_stack, _colour_chat(picture, green))  # purple's blocks are cached
    assert second.prompt_ids == first.prompt_ids
    ids, rows = first.prompt_ids, len(purple)
    span = next(i for i in range(len(ids)) if ids[i:i + rows] == [FILLER_ID] * rows)
    assert first.hits == 0 and second.hits == span // BLOCK * BLOCK
    assert [colors.read_answer(a.text) for a in (first, second)] == [("blue", "purple"), ("blue", "green")]


def test_a_second_turn_resending_picture_and_embeds_hits_the_first_and_names_its_own_colours(colors_stack,
                                                                                            colors_dir):
    _reset(colors_stack)
    pictures, rows = _pictures(), _favorite_rows(colors_dir, "purple")
    turn1 = {c: _colour_chat(pictures[c], rows) for c in pictures}
    first = {c: _ask_colours(colors_stack, turn1[c]) for c in pictures}  # both cached: the same IDs
    follow = "What color is the picture, and what is my favorite color?"
    turn2 = {c: [*turn1[c], {"role": "assistant", "content": first[c].text}, {"role": "user", "content": follow}]
             for c in pictures}
    second = {c: _ask_colours(colors_stack, turn2[c]) for c in pictures}
    for c in pictures:
        n1, ids2 = len(first[c].prompt_ids), second[c].prompt_ids
        assert ids2[:n1] == first[c].prompt_ids
        # turn 1's prompt blocks and its answer's (re-sent as the assistant's turn), as far as turn 2's IDs repeat them
        kept = first[c].prompt_ids + first[c].token_ids[:-1]
        reread = min(_common(kept, ids2) // BLOCK, _held(first[c]), _whole(len(ids2)) // BLOCK) * BLOCK
        assert second[c].hits == reread >= n1 // BLOCK * BLOCK > 0, (second[c].hits, reread, n1)
        assert colors.read_answer(first[c].text) == colors.read_answer(second[c].text) == (c, "purple"), second[c]
    _reset(colors_stack)
    uncached = {c: _ask_colours(colors_stack, turn2[c]) for c in pictures}
    assert all(_same(second[c], uncached[c]) for c in pictures)
