"""The simulated forward (engine/simulate.py, --simulate-forward-ms) in-process: its pure pieces, and the real engine
around it (scheduler, runner bookkeeping, sampler, prefix cache, forks, chunked prefill, aborts) giving the chain of
`simulated_next` for every path. The whole stack over gRPC and HTTP: tests/integration/test_simulated_forward.py."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from engine.config import EngineConfig
from engine.forwards import PREFILL_CHUNK
from engine.llm_engine import LLMEngine
from engine.models.idefics3 import Idefics3
from engine.models.slot_cache import SlotKV
from engine.prefix_cache import PrefixCache
from engine.scheduler import DEFAULT_MIXED_PREFILL_TOKENS, GPU_MIXED_PREFILL_TOKENS
from engine.simulate import Device, forward_seconds, from_digits, simulated_chain, simulated_next, to_digits
from splice.engine_request import EngineRequest, NamedTensor
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, image_inputs, random_ids, start_engine, text_request


def test_next_token_is_the_documented_formula_for_ints_and_tensors():
    assert simulated_next(5, 3, 661) == 177  # 5 * 31 + 3 * 7 + 1 = 177
    assert simulated_next(600, 10, 661) == 163  # 18671 = 28 * 661 + 163
    tokens, positions = torch.tensor([5, 600]), torch.tensor([3, 10])
    assert simulated_next(tokens, positions, 661).tolist() == [177, 163]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_token_ids_survive_a_hidden_row_in_every_dtype(dtype):
    ids = torch.tensor([[0, 1, 255, 256], [65535, 65536, 262143, (1 << 24) - 1]])
    rows = to_digits(ids, 8, dtype)
    assert rows.shape == (2, 4, 8) and rows.dtype == dtype and not rows[..., 3:].any()
    assert torch.equal(from_digits(rows), ids)


def test_a_forward_waits_one_step_for_its_rows_and_one_per_512_prompt_positions():
    assert forward_seconds(10, 256, 0) == pytest.approx(0.010)
    assert forward_seconds(10, 0, 1) == pytest.approx(0.010)
    assert forward_seconds(10, 0, 513) == pytest.approx(0.020)
    assert forward_seconds(10, 3, 512) == pytest.approx(0.020)
    assert forward_seconds(25, 3, 1025) == pytest.approx(0.100)


def test_launched_calls_queue_up_and_synchronize_waits_for_all_of_them():
    device = Device()
    before = time.monotonic()
    device.launch(0.05)
    device.launch(0.05)  # runs after the first, as a device's queue would
    device.launch(0)
    assert device.due >= before + 0.1
    device.synchronize()
    assert time.monotonic() >= before + 0.1
    device.synchronize()  # nothing left: returns at once
    again = time.monotonic()
    device.launch(0.01)
    assert device.due >= again + 0.01  # counted from now, not from the earlier due time


def test_mixed_prefill_tokens_default_by_where_the_forward_runs(tiny_dirs):
    for simulate, given, want in ((None, None, DEFAULT_MIXED_PREFILL_TOKENS), (1.0, None, GPU_MIXED_PREFILL_TOKENS),
                                  (1.0, 64, 64), (None, 300, 300)):
        engine = LLMEngine(EngineConfig(model=str(tiny_dirs["tiny-text"]), simulate_forward_ms=simulate,
                                        mixed_prefill_tokens=given))
        assert engine.scheduler.mixed_prefill_tokens == want, (simulate, given)


def test_the_prefix_cache_keeps_nothing_from_a_batch_no_layer_wrote():
    cache, kv = PrefixCache(16, 1 << 20), SlotKV()
    kv.add_rows([0], [32])
    cache.store([b"a" * 32, b"b" * 32], kv, 0, 0)
    assert cache.blocks == 0 and cache.capacity == 0
    cache.restore([], kv, 0, 33)  # nothing to restore: nothing is written
    assert not kv.layers


@pytest.fixture(scope="module")
def sim_engine(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"], simulate_forward_ms=1.0, max_running_seqs=8,
                          mixed_prefill_tokens=64)
    asyncio.run(engine.warmup())
    yield engine
    engine.stop()


async def _idle(engine) -> None:
    while engine.num_running or engine.num_waiting or engine.runner.batch is not None:
        await asyncio.sleep(0.005)


async def test_greedy_sampled_and_forked_choices_follow_the_chain(sim_engine):
    engine = sim_engine
    vocab = engine.m.family.vocab
    assert vocab == engine.m.model.get_output_embeddings().weight.shape[0]  # the real logits' width
    ids = random_ids(9, seed=1)
    greedy, _ = await collect(engine, text_request(ids, "g", max_tokens=12))
    sampled, _ = await collect(engine, text_request(ids, "s", max_tokens=12, temperature=1.0, top_p=0.9,
                                                    repetition_penalty=1.3))
    assert greedy == sampled == simulated_chain(ids, 12, vocab)
    outs = [o async for o in engine.generate(text_request(ids, "n", max_tokens=6, n=3, temperature=0.8))]
    per_choice = {i: [t for o in outs if o.index == i for t in o.token_ids] for i in range(3)}
    assert all(toks == simulated_chain(ids, 6, vocab) for toks in per_choice.values())
    await _idle(engine)


async def test_chunked_and_packed_prefills_beside_decoding_rows_follow_the_chain(sim_engine):
    """A prompt longer than --mixed-prefill-tokens arrives while others decode: prefilled over several packed steps;
    one longer than the runner's chunk; the same prompt twice (the prefix cache makes keys, keeps no block)."""
    engine = sim_engine
    vocab = engine.m.family.vocab
    steps = engine.steps
    short = [random_ids(5, seed=k) for k in range(3)]
    long_ids = random_ids(300, seed=7, low=40, high=600)
    longer = random_ids(PREFILL_CHUNK + 100, seed=8, low=40, high=600)
    running = [asyncio.ensure_future(collect(engine, text_request(p, f"d{k}", max_tokens=40)))
               for k, p in enumerate(short)]
    while engine.num_running < 3:
        await asyncio.sleep(0.005)
    got = await asyncio.gather(collect(engine, text_request(long_ids, "long", max_tokens=5)),
                               collect(engine, text_request(long_ids, "again", max_tokens=5)),
                               collect(engine, text_request(longer, "longer", max_tokens=5)))
    assert [g[0] for g in got] == [simulated_chain(long_ids, 5, vocab)] * 2 + [simulated_chain(longer, 5, vocab)]
    assert [(await r)[0] for r in running] == [simulated_chain(p, 40, vocab) for p in short]
    assert engine.packed_steps > 0 and engine.steps > steps
    assert engine.prefix is not None and engine.prefix.blocks == 0
    await _idle(engine)


async def test_prompt_logprobs_are_the_simulated_models(sim_engine):
    engine = sim_engine
    ids = random_ids(20, seed=3)
    _, outs = await collect(engine, text_request(ids, "plp", max_tokens=1, prompt_logprobs=1))
    plp = next(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)
    vocab = engine.m.family.vocab
    # position p (p >= 1) is scored by the logits of position p - 1: its top token is the chain's step from there
    assert list(plp.top_ids) == [simulated_next(ids[p - 1], p - 1, vocab) for p in range(1, len(ids))]
    hit = [p for p in range(1, len(ids)) if ids[p] == plp.top_ids[p - 1]]
    assert all(plp.ranks[p - 1] == 1 for p in hit) and all(r > 1 for p, r in enumerate(plp.ranks, 1) if p not in hit)


async def test_an_abort_mid_stream_frees_the_row(sim_engine):
    engine = sim_engine
    gen = engine.generate(text_request(random_ids(5, seed=4), "gone", max_tokens=1000))
    got = [await gen.__anext__() for _ in range(3)]
    assert engine.num_running == 1
    await gen.aclose()
    await asyncio.wait_for(_idle(engine), 30)
    assert len(got) == 3 and not engine.requests


async def test_pictures_go_through_the_families_geometry_with_zero_features(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-idefics3"], simulate_forward_ms=0.0)
    try:
        assert isinstance(engine.m.family, Idefics3)  # the real family, its model calls simulated
        ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"])
        req = EngineRequest("pic", ids, [], [NamedTensor(k, v) for k, v in tensors.items()],
                            SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4))
        prompt = engine.m.family.prompt(req)
        image = prompt.image_mask
        assert image.sum() == engine.m.family.images.expected_rows(tensors) > 0
        assert not prompt.embeds[image].any() and torch.equal(from_digits(prompt.embeds[~image]),
                                                              torch.tensor(ids)[~image])
        toks, _ = await collect(engine, req)
        assert toks == simulated_chain(ids, 4, engine.m.family.vocab)
    finally:
        engine.stop()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma4", "tiny-qwen2-vl", "tiny-qwen3.5", "tiny-lfm2-vl",
                                  "tiny-llava", "tiny-llava-onevision", "tiny-nemotron-omni"])
async def test_every_family_follows_the_chain_with_its_own_masks_positions_and_caches(tiny_dirs, name):
    """M-RoPE positions, per-layer-type masks, Gemma 4's per-layer inputs, the hybrid recurrent caches (no packed
    steps: decode and prefill run as separate forwards) and an n = 2 fork of them."""
    engine = start_engine(tiny_dirs[name], simulate_forward_ms=0.0)
    try:
        ids = random_ids(7, seed=11)
        vocab = engine.m.family.vocab
        toks, _ = await collect(engine, text_request(ids, "t", max_tokens=6))
        assert toks == simulated_chain(ids, 6, vocab)
        outs = [o async for o in engine.generate(text_request(ids, "n", max_tokens=4, n=2, temperature=0.5))]
        per_choice = [[t for o in outs if o.index == i for t in o.token_ids] for i in range(2)]
        assert per_choice == [simulated_chain(ids, 4, vocab)] * 2
    finally:
        engine.stop()
