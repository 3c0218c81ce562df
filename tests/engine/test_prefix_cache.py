"""The prefix cache (engine/prefix_cache.py): keys made of content, the block pools' LRU, and the engine's use of it
on an attention-only family that packs mixed steps (tiny-text) and one that does not (tiny-gemma3): hits while
others decode, concurrent arrivals sharing a prefix, an abort mid-prefill after a hit, eviction within a small
budget. Every family's tokens with the cache equal its tokens without it: tests/engine/test_families.py."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.models.slot_cache import SlotKV
from engine.prefix_cache import PrefixCache, PrefixKeys, cache_root, prefix_keys
from engine.scheduler import DEFAULT_MIXED_PREFILL_TOKENS
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request

ROOT = cache_root("model-a", 4, None)


def _keys(req: EngineRequest, root: bytes = ROOT, pictures: list[str] | None = None, rows: list[int] | None = None,
          image_id: int | None = None, both_ways: bool = False) -> PrefixKeys:
    pieces = [{"pixel_values": torch.zeros(1)} for _ in pictures or []]
    return prefix_keys(req, 4, root, image_id, pieces, rows or [], pictures, both_ways)


def _with_rows(ids: list[int], at: int, rows: torch.Tensor) -> EngineRequest:
    return EngineRequest("r", list(ids), [EmbedSpan(at, rows.shape[0], 0)], [NamedTensor(PROMPT_EMBEDS, rows)])


def _first_difference(a: PrefixKeys, b: PrefixKeys) -> int:
    return next((k for k, (x, y) in enumerate(zip(a.keys, b.keys, strict=True)) if x != y), len(a.keys))


def test_keys_chain_token_ids_and_cover_whole_blocks_only():
    ids = list(range(10, 24))  # 14 positions: 3 whole blocks of 4
    a = _keys(EngineRequest("r", ids))
    assert len(a.keys) == 3 and len(set(a.keys)) == 3
    assert _keys(EngineRequest("r", ids)).keys == a.keys
    other = [*ids[:5], 99, *ids[6:]]  # block 1 differs: it and every block after it
    assert _first_difference(a, _keys(EngineRequest("r", other))) == 1
    assert _keys(EngineRequest("r", other)).keys[2] != a.keys[2]


def test_rows_key_their_blocks_so_filler_ids_never_key_alone():
    ids = [5] * 16
    rows = torch.randn(6, 8)
    a = _keys(_with_rows(ids, 5, rows))  # the span covers positions 5..10: blocks 1 and 2
    moved = rows.clone()
    moved[5, 0] += 1e-3  # the span's last row (position 10, block 2)
    assert _first_difference(a, _keys(_with_rows(ids, 5, moved))) == 2
    assert _first_difference(a, _keys(EngineRequest("r", ids))) == 1  # the same IDs without rows
    assert _first_difference(a, _keys(_with_rows(ids, 5, rows.double()))) == 1  # same values, another dtype


def test_pictures_key_the_block_where_they_start():
    image = 7
    ids = [1, 2, 3, 4, 5, 6, image, image, image, image, image, 8, 9, 10, 11, 12]
    a = _keys(EngineRequest("r", ids, tensors=[NamedTensor("pixel_values", torch.zeros(1))]), pictures=["aa" * 32],
              rows=[5], image_id=image)
    b = _keys(EngineRequest("r", ids, tensors=[NamedTensor("pixel_values", torch.zeros(1))]), pictures=["bb" * 32],
              rows=[5], image_id=image)
    assert _first_difference(a, b) == 1  # the picture starts at position 6, in block 1
    assert a.cuts is None
    # images seen both ways (Gemma 3): no hit may end inside the run (positions 6..10 span blocks 1 and 2)
    both = _keys(EngineRequest("r", ids, tensors=[NamedTensor("pixel_values", torch.zeros(1))]),
                 pictures=["aa" * 32], rows=[5], image_id=image, both_ways=True)
    assert both.cuts == [True, False, True, True] and both.hit_blocks(4, 4) == 4 and both.hit_blocks(2, 4) == 1


def test_salt_and_model_make_the_root():
    ids = list(range(8))
    plain = _keys(EngineRequest("r", ids))
    salted = _keys(EngineRequest("r", ids), cache_root("model-a", 4, "tenant-a"))
    other = _keys(EngineRequest("r", ids), cache_root("model-a", 4, "tenant-b"))
    model = _keys(EngineRequest("r", ids), cache_root("model-b", 4, None))
    assert len({k for x in (plain, salted, other, model) for k in x.keys}) == 8  # no block shared


def _kv_with(columns: int, fill: float) -> SlotKV:
    kv = SlotKV()
    for layer in (0, 1):
        keys = torch.full((2, columns, 3), fill) + torch.arange(columns)[None, :, None]
        kv.write_columns(layer, 0, keys, -keys, columns)
    return kv


def test_the_pool_keeps_blocks_within_its_budget_and_evicts_chain_tails_first():
    per_block = 2 * 2 * 2 * 4 * 3 * 4  # layers x (k, v) x kv_heads x block x head_dim x float32
    cache = PrefixCache(4, 5 * per_block)
    a = [bytes([1, k]) for k in range(3)]
    cache.store(a, _kv_with(12, 0.0), 0, 0)
    assert cache.capacity == 5 and cache.blocks == 3
    assert cache.match(PrefixKeys(a), 3) == 3 and cache.match(PrefixKeys(a), 2) == 2
    b = [bytes([2, k]) for k in range(3)]
    cache.store(b, _kv_with(12, 100.0), 0, 0)  # needs one more block than is free: a's tail goes
    assert cache.blocks == 5 and cache.match(PrefixKeys(a), 3) == 2 and cache.match(PrefixKeys(b), 3) == 3
    # a hit writes the blocks' columns where they were read from
    out = SlotKV()
    cache.restore(b[:2], out, 1, 16)
    want = _kv_with(12, 100.0)
    for layer in (0, 1):
        assert torch.equal(out.layers[layer].k_buf[1, :, :8], want.layers[layer].k_buf[0, :, :8])
        assert torch.equal(out.layers[layer].v_buf[1, :, :8], want.layers[layer].v_buf[0, :, :8])
    # blocks a restore of this step will read are not what makes room for others
    cache.pinned = set(b)
    c = [bytes([3, k]) for k in range(3)]
    cache.store(c, _kv_with(12, 200.0), 0, 0)  # room for two: a's head goes, b stays whole
    assert cache.match(PrefixKeys(b), 3) == 3 and cache.match(PrefixKeys(a), 3) == 0
    assert cache.match(PrefixKeys(c), 3) == 2 and cache.blocks == 5
    cache.pinned = set()
    cache.reset()
    assert cache.blocks == 0 and cache.match(PrefixKeys(b), 3) == 0


def _hits() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("splice_engine_prefix_cache_hits_total") or 0.0


@pytest.fixture(scope="module", params=["tiny-text", "tiny-gemma3"])
def engine(request, tiny_dirs):
    engine = start_engine(tiny_dirs[request.param])
    yield engine
    engine.stop()


async def _solo(engine, reqs):
    out = []
    for r in reqs:
        await engine.reset_prefix_cache()
        out.append((await collect(engine, r))[0])
    await engine.reset_prefix_cache()
    return out


async def test_arrivals_sharing_a_cached_prefix_give_their_solo_tokens_while_others_decode(engine):
    prefix = random_ids(70, seed=3)
    reqs = [text_request(prefix + random_ids(5 + 4 * k, seed=10 + k), f"r{k}", max_tokens=8 + k) for k in range(6)]
    runner = text_request(random_ids(9, seed=4), "runner", max_tokens=60)
    solo = await _solo(engine, [runner, *reqs])
    await collect(engine, text_request([*prefix, 11], "warm", max_tokens=1))
    hits = _hits()
    keep = asyncio.ensure_future(collect(engine, runner))
    while not any(s.request_id == "runner" for s in engine.scheduler.running):
        await asyncio.sleep(0.005)
    together = await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert [t for t, _ in together] == solo[1:]
    assert (await keep)[0] == solo[0]
    assert _hits() - hits >= 6 * (70 // 16 * 16)
    assert engine.scheduler.prefilling is None


async def test_a_hit_aborted_mid_prefill_frees_its_slot(engine):
    prefix = random_ids(40, seed=5)
    await collect(engine, text_request([*prefix, 12], "warm", max_tokens=1))
    engine.scheduler.mixed_prefill_tokens = 4
    try:
        keep = asyncio.ensure_future(collect(engine, text_request(random_ids(5, seed=1), "keep", max_tokens=300)))
        while not any(s.request_id == "keep" for s in engine.scheduler.running):
            await asyncio.sleep(0.005)
        # the cached 32 positions, then 300 more in parts of 4: observably mid-prefill for many steps
        gen = engine.generate(text_request(prefix + random_ids(300, seed=6), "gone", max_tokens=5))
        task = asyncio.ensure_future(gen.__anext__())
        while getattr(engine.scheduler.prefilling, "request_id", None) != "gone":
            assert not task.done(), "the prompt was prefilled before it was seen mid-prefill"
            await asyncio.sleep(0.001)
        assert engine.scheduler.prefilling.cached == 32
        assert engine.abort("gone") == 1
        with pytest.raises(Exception, match="aborted"):
            await task
        assert len((await keep)[0]) == 300
    finally:
        engine.scheduler.mixed_prefill_tokens = DEFAULT_MIXED_PREFILL_TOKENS
    assert engine.scheduler.prefilling is None
    again = text_request(prefix + random_ids(30, seed=7), "again", max_tokens=6)
    assert (await collect(engine, again))[0] == (await _solo(engine, [again]))[0]


async def test_a_small_budget_evicts_and_the_tokens_stay(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"], prefix_cache_mb=1)
    try:
        reqs = [text_request(random_ids(600, seed=20 + k), f"p{k}", max_tokens=5) for k in range(4)]
        solo = await _solo(engine, reqs)
        await collect(engine, reqs[0])
        capacity = engine.prefix.capacity
        assert 0 < capacity < 4 * (600 // 16), "the budget must hold fewer blocks than the prompts make"
        for r, want in zip([*reqs, reqs[0], *reqs], [*solo, solo[0], *solo], strict=True):
            assert (await collect(engine, r))[0] == want
            assert engine.prefix.blocks <= capacity
    finally:
        engine.stop()


async def test_a_next_turn_reads_the_generated_tokens_blocks(engine):
    await engine.reset_prefix_cache()
    prompt = random_ids(50, seed=8)
    answer, _ = await collect(engine, text_request(prompt, "turn1", max_tokens=40))
    assert engine.prefix.blocks == (50 + 40 - 1) // 16  # the prompt's and the answer's whole blocks
    turn2 = text_request([*prompt, *answer, *random_ids(12, seed=9)], "turn2", max_tokens=6)
    want = (await _solo(engine, [turn2]))[0]
    await collect(engine, text_request(prompt, "turn1", max_tokens=40))
    hits = _hits()
    assert (await collect(engine, turn2))[0] == want
    # the prompt's and the answer's whole blocks, all but the answer's last token (never fed through the model)
    assert _hits() - hits == (50 + 40 - 1) // 16 * 16
