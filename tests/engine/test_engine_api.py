"""The engine through its async API on the tiny models: equivalence, reference logits, batching, cancel."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from engine.llm_engine import Cancelled
from splice.engine_output import FinishReason, Usage
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.errors import InvalidArgument, ResourceExhausted
from splice.sampling import SamplingParams
from tests.engine.engine_factories import (
    GREEDY,
    collect,
    image_inputs,
    random_ids,
    start_engine,
    text_request,
    with_embed_span,
)
from tests.engine.runner_rows import Rows


async def _wait_idle(engine, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if engine.num_running == 0 and engine.num_waiting == 0 and engine.runner.batch is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine not idle: {engine.num_running} running, {engine.num_waiting} waiting")


def _hf_greedy(engine, ids: list[int], n: int) -> list[int]:
    """HF generate's own greedy continuation, the independent reference."""
    model = engine.m.model
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


# --- equivalence ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["text_engine", "idefics3_engine"])
async def test_embeddings_of_a_texts_tokens_give_the_texts_greedy_tokens(request, tiny_dirs, fixture):
    from transformers import AutoTokenizer

    engine = request.getfixturevalue(fixture)
    name = "tiny-text" if fixture == "text_engine" else "tiny-idefics3"
    tok = AutoTokenizer.from_pretrained(tiny_dirs[name])
    ids = tok("The quick brown fox jumps over the lazy dog", add_special_tokens=False).input_ids
    table = engine.m.embed.weight.detach()
    as_text, _ = await collect(engine, text_request(ids, max_tokens=12))
    # whole prompt supplied as embeddings; the IDs are filler
    whole = EngineRequest("e", [0] * len(ids), [EmbedSpan(0, len(ids), 0)],
                          [NamedTensor(PROMPT_EMBEDS, table[ids].clone())], SamplingParams(**GREEDY, max_tokens=12))
    # a middle part supplied, the rest as text
    a, b = 2, len(ids) - 2
    part = EngineRequest("p", ids[:a] + [0] * (b - a) + ids[b:], [EmbedSpan(a, b - a, 0)],
                         [NamedTensor(PROMPT_EMBEDS, table[ids[a:b]].clone())], SamplingParams(**GREEDY, max_tokens=12))
    assert (await collect(engine, whole))[0] == as_text
    assert (await collect(engine, part))[0] == as_text
    assert as_text == _hf_greedy(engine, ids, 12)


# --- reference ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("fixture", "name"), [("llava_engine", "tiny-llava"), ("idefics3_engine", "tiny-idefics3")])
async def test_first_step_logits_match_hf_forward_on_the_same_inputs_embeds(request, tiny_dirs, fixture, name):
    engine = request.getfixturevalue(fixture)
    m = engine.m
    ids, tensors = image_inputs(tiny_dirs[name])
    rows = torch.randn(3, m.info.hidden_size, generator=torch.Generator().manual_seed(1))  # [3, hidden]
    at = 2
    req = with_embed_span(ids, tensors, at, rows, max_tokens=1, logprobs=True)

    # HF's own merge: it finds image positions in inputs_embeds and writes its vision features there
    with torch.inference_mode():
        x = m.embed(torch.tensor(req.token_ids)).clone()  # [prompt_len, hidden]
        x[at:at + 3] = rows
        hf_logits = m.model(inputs_embeds=x[None], **tensors).logits[0, -1].float()  # [vocab]

    runner = Rows(m.family)  # the engine's own parts, on a private batch
    logits = runner.prefill([0], [m.family.prompt(req)])[0]
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=1e-4)

    tokens, outs = await collect(engine, req)
    assert tokens == [int(hf_logits.argmax())]
    assert outs[-1].logprobs[0] == pytest.approx(float(hf_logits.log_softmax(-1).max()), abs=1e-4)
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].usage.prompt_tokens == len(req.token_ids)


# --- batching -------------------------------------------------------------------------------------

async def test_eight_concurrent_greedy_requests_match_their_solo_runs(text_engine):
    engine = text_engine
    # the even half starts first and runs long; the odd half joins once the even half is decoding
    reqs = [text_request(random_ids(3 + 5 * i, seed=i), f"b{i}", max_tokens=48 - i if i % 2 == 0 else 6 + i)
            for i in range(8)]
    solo = []
    steps0 = engine.steps
    for r in reqs:
        solo.append((await collect(engine, r))[0])
    solo_steps = engine.steps - steps0
    for r, toks in zip(reqs[:2], solo[:2], strict=True):
        assert toks == _hf_greedy(engine, r.token_ids, len(toks))

    arrivals: list[str] = []  # request id of every output, in arrival order
    early_started = asyncio.Event()

    async def run(r, wait: bool):
        if wait:  # the odd half joins while the even half is decoding
            await early_started.wait()
        toks = []
        async for out in engine.generate(r):
            arrivals.append(r.request_id)
            toks += out.token_ids
            if len(toks) >= 2:  # a busy loop may get two steps merged into one output
                early_started.set()
        return toks

    steps0 = engine.steps
    together = await asyncio.gather(*(run(r, wait=bool(i % 2)) for i, r in enumerate(reqs)))
    assert together == solo
    assert engine.steps - steps0 < solo_steps / 2, "requests did not share forward passes"
    first_late = min(arrivals.index(f"b{i}") for i in range(1, 8, 2))
    assert any(rid in {f"b{i}" for i in range(0, 8, 2)} for rid in arrivals[first_late + 1:]), \
        "late requests only started after the early ones had finished"
    await _wait_idle(engine)


async def test_concurrent_mixed_image_and_embeds_requests_match_their_solo_runs(idefics3_engine, tiny_dirs):
    engine = idefics3_engine
    reqs = []
    for i, size in enumerate([(70, 45), (30, 30), (45, 70), (64, 64)]):  # different tile counts
        ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"], prompt_text="Describe" + " it" * i, size=size)
        rows = torch.randn(1 + i, engine.info.hidden_size, generator=torch.Generator().manual_seed(i))
        reqs.append(with_embed_span(ids, tensors, 1 + i, rows, f"m{i}", max_tokens=6 + 2 * i))
    solo = [(await collect(engine, r))[0] for r in reqs]
    together = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert [t[0] for t in together] == solo
    await _wait_idle(engine)


async def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(text_engine):
    params = dict(temperature=0.9, top_p=0.9, top_k=50, seed=1234, max_tokens=10)
    ids = random_ids(9, seed=5)
    alone = (await collect(text_engine, text_request(ids, **params)))[0]
    others = [text_request(random_ids(4 + i, seed=20 + i), f"o{i}", temperature=1.0, max_tokens=8) for i in range(3)]
    results = await asyncio.gather(collect(text_engine, text_request(ids, **params)),
                                   *(collect(text_engine, r) for r in others))
    assert results[0][0] == alone
    other_seed = (await collect(text_engine, text_request(ids, **{**params, "seed": 99})))[0]
    assert other_seed != alone  # 10 draws from a near-uniform tiny model: a collision would be astronomical


async def test_stop_token_ids_and_max_tokens(text_engine):
    ids = random_ids(6, seed=7)
    free, _ = await collect(text_engine, text_request(ids, max_tokens=10))
    stop_at = free[3]
    first = free.index(stop_at)
    toks, outs = await collect(text_engine, text_request(ids, max_tokens=10, stop_token_ids=[stop_at]))
    assert toks == free[:first + 1] and outs[-1].finish_reason is FinishReason.STOP
    assert outs[-1].usage == Usage(6, first + 1)
    toks, outs = await collect(text_engine, text_request(ids, max_tokens=4))
    assert toks == free[:4] and outs[-1].finish_reason is FinishReason.LENGTH
    # one token per output unless the reader fell behind and got several steps merged
    assert all(o.token_ids for o in outs) and all(o.finish_reason is None for o in outs[:-1])


async def test_context_full_ends_with_length(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"], max_model_len=12)
    try:
        toks, outs = await collect(engine, text_request(random_ids(8, seed=3)))
        assert len(toks) == 4 and outs[-1].finish_reason is FinishReason.LENGTH
        with pytest.raises(InvalidArgument, match="max_model_len is 12"):
            await collect(engine, text_request(random_ids(12, seed=3)))
    finally:
        engine.stop()


# --- leaving: cancellation and failures -------------------------------------------------------------

async def test_closing_the_stream_aborts_and_frees_the_slot(text_engine):
    engine = text_engine
    keep = asyncio.ensure_future(collect(engine, text_request(random_ids(5, seed=1), "keep", max_tokens=300)))
    gen = engine.generate(text_request(random_ids(7, seed=2), "gone", max_tokens=1000))
    got = [await gen.__anext__() for _ in range(2)]
    for _ in range(500):  # "keep" is validated in a thread: admitted, then prefilled, a step or two later
        if engine.num_running == 2 and engine.runner.rows == 2:
            break
        await asyncio.sleep(0.01)
    assert engine.num_running == 2 and engine.runner.rows == 2
    await gen.aclose()
    for _ in range(500):
        if engine.runner.rows < 2:
            break
        await asyncio.sleep(0.01)
    assert engine.runner.rows <= 1 and all(s.request_id != "gone" for s in engine.requests.values())
    assert len(got) == 2
    toks, _ = await keep
    assert len(toks) == 300
    await _wait_idle(engine)


async def test_abort_by_request_id_ends_the_stream(text_engine):
    engine = text_engine
    seen = []
    at_abort = []

    async def consume():
        async for out in engine.generate(text_request(random_ids(5, seed=4), "victim", max_tokens=1000)):
            seen.append(out)
            if len(seen) == 2:
                victim = next(s for s in engine.requests.values() if s.request_id == "victim")
                at_abort.append(victim.num_generated)
                assert engine.abort("victim") == 1

    with pytest.raises(Cancelled):
        await consume()
    # outputs already made are delivered; at most the step running when the abort came in adds one more
    assert 2 <= len(seen) <= at_abort[0] + 1
    await _wait_idle(engine)


async def test_cancelled_task_aborts_the_sequence(text_engine):
    engine = text_engine
    task = asyncio.ensure_future(collect(engine, text_request(random_ids(5, seed=6), "task", max_tokens=1000)))
    while engine.num_running == 0:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_idle(engine)


async def test_a_failure_inside_one_requests_forward_leaves_the_others_running(llava_engine, tiny_dirs,
                                                                                monkeypatch):
    engine = llava_engine
    ids, tensors = image_inputs(tiny_dirs["tiny-llava"])
    real = engine.m.family.image_features

    def exploding(inputs):  # fails for one marked image only: isolates the failure, not the vision tower
        if float(inputs["pixel_values"].flatten()[0]) == 0.5:
            raise RuntimeError("vision tower blew up")
        return real(inputs)

    monkeypatch.setattr(engine.m.family, "image_features", exploding)
    bad = {k: v.clone() for k, v in tensors.items()}
    bad["pixel_values"].view(-1)[0] = 0.5
    good_req = with_embed_span(ids, tensors, 1, torch.zeros(2, 64), "good", max_tokens=8)
    bad_req = with_embed_span(ids, bad, 1, torch.zeros(2, 64), "bad", max_tokens=8)
    results = await asyncio.gather(collect(engine, good_req), collect(engine, bad_req), return_exceptions=True)
    assert isinstance(results[1], RuntimeError) and "blew up" in str(results[1])
    assert len(results[0][0]) == 8
    monkeypatch.undo()
    assert (await collect(engine, good_req))[0] == results[0][0]
    await _wait_idle(engine)


async def test_a_full_queue_is_resource_exhausted_and_the_queue_drains(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"], max_running_seqs=1, max_batch_tokens=64, max_queue=1)
    try:
        first = asyncio.ensure_future(collect(engine, text_request(random_ids(4, seed=1), "a", max_tokens=200)))
        while engine.num_running == 0:
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(collect(engine, text_request(random_ids(4, seed=2), "b", max_tokens=3)))
        while engine.num_waiting == 0:
            await asyncio.sleep(0.005)
        with pytest.raises(ResourceExhausted, match="queue is full"):
            await collect(engine, text_request(random_ids(4, seed=3), "c", max_tokens=3))
        assert len((await first)[0]) == 200 and len((await second)[0]) == 3
    finally:
        engine.stop()


async def test_a_prefill_failure_in_a_group_fails_only_that_request(text_engine, monkeypatch):
    engine = text_engine
    real_prefill = engine.runner._prefill_whole
    poison = 9.0  # a prompt row starting with this value makes the forward raise (fault injection)

    poisoned_groups = []
    calls = []

    def prefill(group, parts, out):  # a group of whole prompts, prefilled together
        prompts = [parts[i].prompt for i in group]
        deadline = time.monotonic() + 5
        while calls and engine.num_waiting < 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # hold the first prefill until the other three queue up behind it
        calls.clear()
        if any(float(p.embeds[0, 0]) == poison for p in prompts):
            poisoned_groups.append(len(prompts))
            raise RuntimeError("forward failed")
        return real_prefill(group, parts, out)

    def mixed(tokens, parts):  # the group joins while `first` decodes: a packed step, which falls back to two
        if any(float(p.prompt.embeds[0, 0]) == poison for p in parts):
            raise RuntimeError("forward failed")
        return real_mixed(tokens, parts)

    real_mixed = engine.runner._packed
    monkeypatch.setattr(engine.runner, "_prefill_whole", prefill)
    monkeypatch.setattr(engine.runner, "_packed", mixed)
    rows = torch.full((2, engine.info.hidden_size), poison)
    bad = EngineRequest("bad", [0, 0, 5], [EmbedSpan(0, 2, 0)], [NamedTensor(PROMPT_EMBEDS, rows)],
                        SamplingParams(**GREEDY, max_tokens=4))
    goods = [text_request(random_ids(4 + i, seed=40 + i), f"g{i}", max_tokens=5) for i in range(3)]
    solo = [(await collect(engine, g))[0] for g in goods]
    calls.append(1)
    first = asyncio.ensure_future(collect(engine, goods[0]))  # its prefill waits for the other three
    while engine.num_waiting + engine.num_running == 0:
        await asyncio.sleep(0.005)
    rest = await asyncio.gather(*(collect(engine, r) for r in [bad, goods[1], goods[2]]), return_exceptions=True)
    results = [await first, *rest]
    assert isinstance(results[1], RuntimeError)
    assert [results[0][0], results[2][0], results[3][0]] == solo
    assert max(poisoned_groups) > 1 and poisoned_groups[-1] == 1  # failed as a group, then alone
    await _wait_idle(engine)
