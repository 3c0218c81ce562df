"""engine/step_threads.py: a step of many prompt positions runs on the prefill threads, every other on the usual
count, and the tokens do not depend on it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.step_threads import PREFILL_THREADS_AT, StepThreads
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request


def test_the_count_follows_the_steps_prompt_positions():
    threads = StepThreads(usual=1, prefill=2)
    assert [threads.count(n) for n in (0, 1, PREFILL_THREADS_AT - 1, PREFILL_THREADS_AT, 4096)] == [1, 1, 1, 2, 2]


def test_set_for_sets_the_calling_threads_count():
    threads = StepThreads(usual=1, prefill=2)
    try:
        threads.set_for(PREFILL_THREADS_AT)
        assert torch.get_num_threads() == 2
        threads.set_for(3)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(1)


@pytest.fixture
def engines(tiny_dirs):
    both = [start_engine(tiny_dirs["tiny-text"], torch_threads=1, prefill_threads=p) for p in (None, 2)]
    yield both
    for engine in both:
        engine.stop()
    torch.set_num_threads(1)  # what the engine threads set last is torch's default for threads started after


async def test_tokens_are_the_same_on_one_thread_and_with_prefill_threads(engines):
    """A long prompt (its prefill on two threads) arriving while a short one decodes (one thread): each request's
    greedy tokens equal those of an engine that runs every step on one thread."""
    long_ids, short_ids = random_ids(3 * PREFILL_THREADS_AT, seed=1), random_ids(12, seed=2)
    results = []
    for engine in engines:
        short = asyncio.create_task(collect(engine, text_request(short_ids, "short", max_tokens=24)))
        long = await collect(engine, text_request(long_ids, "long", max_tokens=8))
        results.append((long[0], (await short)[0]))
    assert engines[0].runner.threads is None and engines[1].runner.threads is not None
    assert results[0] == results[1]
    assert all(len(long) == 8 and len(short) == 24 for long, short in results)
