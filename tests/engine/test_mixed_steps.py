"""Engine steps that decode the running sequences and prefill arrivals in bounded parts (engine/scheduler.py's
mixed_prefill_tokens lowered so that short prompts span several steps): every request still gets exactly its solo
tokens, for an attention-only family (prefilled in parts across steps), one with sliding windows, and a hybrid one
(whose long prompts are prefilled whole)."""

from __future__ import annotations

import asyncio

import pytest

from engine.scheduler import DEFAULT_MIXED_PREFILL_TOKENS
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request

MODELS = ["tiny-text", "tiny-gemma3", "tiny-qwen3.5"]


@pytest.fixture(scope="module", params=MODELS)
def engine(request, tiny_dirs):
    engine = start_engine(tiny_dirs[request.param])
    yield engine
    engine.stop()


async def test_arrivals_prefilled_in_parts_give_their_solo_tokens(engine):
    reqs = [text_request(random_ids(n, seed=k), f"r{k}", max_tokens=12 + 2 * k)
            for k, n in enumerate((5, 23, 9, 31, 4, 17))]
    solo = [(await collect(engine, r))[0] for r in reqs]
    engine.scheduler.mixed_prefill_tokens = 6
    steps = engine.steps

    async def staggered(k, r):
        await asyncio.sleep(0.03 * k)  # arrive while the earlier ones decode
        return (await collect(engine, r))[0]

    try:
        together = await asyncio.gather(*(staggered(k, r) for k, r in enumerate(reqs)))
    finally:
        engine.scheduler.mixed_prefill_tokens = DEFAULT_MIXED_PREFILL_TOKENS
    assert list(together) == solo
    assert engine.scheduler.prefilling is None
    assert engine.steps > steps


async def test_a_long_prompt_aborted_mid_prefill_frees_its_slot(engine):
    if not engine.m.family.cache.chunkable:
        pytest.skip("a hybrid model prefills a long prompt whole, in its first step")
    engine.scheduler.mixed_prefill_tokens = 4
    try:
        keep = asyncio.ensure_future(collect(engine, text_request(random_ids(5, seed=1), "keep", max_tokens=300)))
        # states, not time windows: a loaded machine only makes them later. (Not the runner's rows: the previous
        # test's last row leaves the batch only after its final output was handed over.)
        while not any(s.request_id == "keep" for s in engine.scheduler.running):
            await asyncio.sleep(0.005)
        # 400 positions in parts of 4: a hundred steps in which the prompt is observably mid-prefill
        gen = engine.generate(text_request(random_ids(400, seed=2), "gone", max_tokens=5))
        task = asyncio.ensure_future(gen.__anext__())
        while getattr(engine.scheduler.prefilling, "request_id", None) != "gone":
            assert not task.done(), "the prompt was prefilled before it was seen mid-prefill"
            await asyncio.sleep(0.001)
        assert engine.abort("gone") == 1
        with pytest.raises(Exception, match="aborted"):
            await task
        assert len((await keep)[0]) == 300
    finally:
        engine.scheduler.mixed_prefill_tokens = DEFAULT_MIXED_PREFILL_TOKENS
    assert engine.scheduler.prefilling is None
