"""A long prompt that asks for prompt logprobs (issue 40 row 10) is prefilled in parts of --mixed-prefill-tokens even on
an idle engine, and short requests that arrive meanwhile pass it: they are answered before its first token, and
their tokens, its tokens and its prompt logprobs equal those of solo runs (the packed path on tiny-text; the two
forwards, a long prompt's columns moved out of the way of the rows joining, on tiny-gemma3)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.engine.engine_factories import collect, random_ids, text_request, wait_until

PART = 16  # --mixed-prefill-tokens


@pytest.mark.parametrize("name", ["tiny-text", "tiny-gemma3"])
async def test_short_requests_pass_a_long_prompt_scored_in_parts_and_every_answer_equals_its_solo_run(engines, name):
    """Another request decodes throughout, so the steps are packed on tiny-text: each short one joins beside the long
    prompt's next part, in the slots its columns were in."""
    engine = engines(name, mixed_prefill_tokens=PART)
    long_ids, bg_ids = random_ids(40 * PART, seed=21), random_ids(4, seed=20)
    shorts = [random_ids(5 + i, seed=22 + i) for i in range(3)]
    solo = engines(name)  # default parts: the long prompt prefilled at once
    want_long, want_outs = await collect(solo, text_request(long_ids, max_tokens=4, prompt_logprobs=5))
    want_shorts = [(await collect(solo, text_request(ids, max_tokens=6)))[0] for ids in shorts]
    want_bg, _ = await collect(solo, text_request(bg_ids, max_tokens=400))

    bg = asyncio.ensure_future(collect(engine, text_request(bg_ids, "bg", max_tokens=400)))
    await wait_until(lambda: engine.runner.rows == 1, "the other request decoding")
    long = asyncio.ensure_future(collect(engine, text_request(long_ids, "long", max_tokens=4, prompt_logprobs=5)))
    await wait_until(lambda: (s := engine.scheduler.prefilling) is not None and s.computed >= PART,
                     "the long prompt prefilled in parts")
    got_shorts = [(await collect(engine, text_request(ids, f"short{i}", max_tokens=6)))[0]
                  for i, ids in enumerate(shorts)]
    assert not long.done()  # every short one was answered while the long prompt was still being prefilled
    got_long, outs = await long
    assert got_shorts == want_shorts
    assert got_long == want_long
    got_plp, want_plp = outs[0].prompt_logprobs, want_outs[0].prompt_logprobs
    assert got_plp.token_ids == want_plp.token_ids and got_plp.top_ids == want_plp.top_ids
    torch.testing.assert_close(torch.tensor(got_plp.logprobs), torch.tensor(want_plp.logprobs), atol=2e-4,
                               rtol=1e-4)
    assert (await bg)[0] == want_bg
