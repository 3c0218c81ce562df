"""The encoder cache through the real services on the trained colours VLM, whose answer names the picture's colour:
pictures of one size (the same placeholder IDs) and different colours, sent one after another in the same
conversation, are each answered with their own colour (a hit on the wrong picture would name another); a picture
sent again is answered the same and moves the engine's hit counter by every piece it holds."""

from __future__ import annotations

import random

import pytest

from app.demo import ask
from app.launch import start_stack
from app.scrape import metrics_address, scrape, value
from app.tiny import DEFAULT_MODEL, colors
from clients import SpliceClient

SIZE = (64, 48)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def cached_stack(tiny_dirs):
    engine, pre = start_stack(DEFAULT_MODEL, engine_args=["--metrics-port", "0", "--encoder-cache-mb", "64"])
    yield engine, pre
    pre.stop()
    engine.stop()


def encoder_cache_counts(address: str) -> tuple[float, float]:
    samples = scrape(address)
    return tuple(value(samples, f"splice_engine_encoder_cache_{n}_total") for n in ("queries", "hits"))


def test_same_size_pictures_answer_their_own_colour_and_a_resent_one_hits(cached_stack):
    engine, pre = cached_stack
    address = metrics_address(engine)
    rng = random.Random(11)
    shape = colors.example("red", "green", rng)  # one conversation: only the picture changes between requests
    picture_colours = ["red", "blue", "yellow", "purple"]
    pictures = {c: colors.picture(c, rng).resize(SIZE) for c in picture_colours}
    with SpliceClient(pre.address, timeout=120) as client:
        start = encoder_cache_counts(address)
        for c in picture_colours:
            answer = colors.read_answer(ask(client, shape.messages(pictures[c]), MAX_TOKENS)[0])
            assert answer == (c, "green"), (c, answer)
        first = encoder_cache_counts(address)
        assert first[0] - start[0] >= len(picture_colours) and first[1] == start[1]  # all new: no hit
        again = colors.read_answer(ask(client, shape.messages(pictures["red"]), MAX_TOKENS)[0])
        resent = encoder_cache_counts(address)
    assert again == ("red", "green")
    queries, hits = resent[0] - first[0], resent[1] - first[1]
    assert queries >= 1 and hits == queries  # every piece (tile) of the re-sent picture found
