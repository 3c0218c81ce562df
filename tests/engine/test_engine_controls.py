"""Penalties and masks through the engine on the tiny text model: HF generate's own continuation under the same
processors, seeded draws that do not depend on the batch, and IDs refused before anything runs."""

from __future__ import annotations

import asyncio

import pytest
import torch

from splice.errors import InvalidArgument
from tests.engine.engine_factories import collect, random_ids, text_request

N = 16


def _hf_greedy(engine, ids: list[int], n: int, **processors) -> list[int]:
    with torch.inference_mode():
        out = engine.m.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                      **processors)
    return out[0, len(ids):].tolist()


async def test_greedy_with_repetition_penalty_bias_and_min_tokens_is_hf_generates(text_engine):
    ids = random_ids(12, seed=5)
    plain, _ = await collect(text_engine, text_request(ids, max_tokens=N))
    favourite = plain[1]  # biased against, so the answer changes
    got, _ = await collect(text_engine, text_request(ids, max_tokens=N, min_tokens=N, repetition_penalty=1.8,
                                                     logit_bias={favourite: -7.5, 40: 3.0}))
    want = _hf_greedy(text_engine, ids, N, repetition_penalty=1.8,
                      sequence_bias=[[[favourite], -7.5], [[40], 3.0]])
    assert got == want and got != plain


async def test_bad_words_and_allowed_token_ids_hold_over_a_whole_answer(text_engine):
    ids = random_ids(10, seed=6)
    plain, _ = await collect(text_engine, text_request(ids, max_tokens=N))
    banned = sorted(set(plain))[:2]
    got, _ = await collect(text_engine, text_request(ids, max_tokens=N, bad_words_token_ids=[[t] for t in banned]))
    assert not set(got) & set(banned)
    allowed = (7, 8, 9)
    got, _ = await collect(text_engine, text_request(ids, max_tokens=N, allowed_token_ids=allowed))
    assert set(got) <= set(allowed)


async def test_frequency_penalty_lowers_repetition_of_a_greedy_answer(text_engine):
    ids = random_ids(8, seed=7)
    plain, _ = await collect(text_engine, text_request(ids, max_tokens=32))
    penalized, _ = await collect(text_engine, text_request(ids, max_tokens=32, frequency_penalty=2.0,
                                                           presence_penalty=2.0))
    assert len(set(penalized)) > len(set(plain))


async def test_a_seeded_request_with_controls_gives_its_solo_tokens_inside_a_batch(text_engine):
    controls = dict(temperature=0.9, seed=11, min_p=0.05, top_p=0.95, repetition_penalty=1.2, frequency_penalty=0.4,
                    presence_penalty=0.3, logit_bias={12: 2.0}, bad_words_token_ids=[[13], [14, 15]], max_tokens=N)
    ids = random_ids(9, seed=8)
    solo, _ = await collect(text_engine, text_request(ids, "solo", **controls))
    others = [text_request(random_ids(5 + k, seed=20 + k), f"o{k}", max_tokens=N + k, temperature=1.0, seed=k,
                           **({"repetition_penalty": 0.8, "min_p": 0.2} if k % 2 else {}))
              for k in range(3)]
    results = await asyncio.gather(*(collect(text_engine, r) for r in [*others[:2], text_request(ids, "batched",
                                                                                                   **controls),
                                                                      others[2]]))
    assert results[2][0] == solo


@pytest.mark.parametrize(("field", "value", "named"), [
    ("logit_bias", {100_000: 1.0}, "logit_bias: token ID 100000"),
    ("allowed_token_ids", (3, 100_001), "allowed_token_ids: token ID 100001 (index 1)"),
    ("bad_words_token_ids", [[5, 100_002]], "bad_words: token ID 100002"),
])
async def test_control_ids_past_the_vocabulary_are_refused(text_engine, field, value, named):
    with pytest.raises(InvalidArgument, match=named.replace("(", r"\(").replace(")", r"\)")):
        await collect(text_engine, text_request([5, 6, 7], max_tokens=2, **{field: value}))
