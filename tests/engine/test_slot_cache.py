"""engine/models/slot_cache.py through the runner (tiny-text): rows join into free slots and leave by taking the last
row into their slot, without reallocating or moving the others; every row keeps its solo tokens."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch

from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import batch_capacity
from splice.engine_request import EngineRequest
from tests.engine.engine_factories import random_ids, text_request, wait_until
from tests.engine.runner_rows import Part, Rows


@pytest.fixture(scope="module")
def family(tiny_dirs):
    return load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family


def _prompt(family, n: int, seed: int):
    ids = torch.randint(40, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return family.prompt(EngineRequest(f"p{seed}", ids))


def _solo(family, prompt, steps: int) -> list[int]:
    runner = Rows(family)
    tokens = runner.prefill([0], [prompt]).argmax(-1).tolist()
    for _ in range(steps):
        tokens += runner.decode(tokens[-1:]).argmax(-1).tolist()
    return tokens


def test_rows_join_and_leave_in_place_with_their_solo_tokens(family):
    prompts = [_prompt(family, n, seed) for seed, n in enumerate((7, 19, 3, 11, 5))]
    solo = [_solo(family, p, 8) for p in prompts]
    runner = Rows(family)
    got: dict[int, list[int]] = {}

    def prefill(seqs):
        for s, t in zip(seqs, runner.prefill(seqs, [prompts[s] for s in seqs]).argmax(-1).tolist(), strict=True):
            got[s] = [t]

    def decode():
        rows = runner.seq_ids
        for s, t in zip(rows, runner.decode([got[s][-1] for s in rows]).argmax(-1).tolist(), strict=True):
            got[s].append(t)

    prefill([0, 1, 2])  # left-padded together: their real columns start at different places
    decode()
    prefill([3])  # joins with its columns from 0, ending earlier than the others'
    decode()
    layer = runner.batch.kv.layers[0]
    buffers = layer.k_buf.data_ptr(), layer.v_buf.data_ptr()
    first_slot = layer.k_buf[0].clone()
    runner.remove({1})  # slot 1 takes the last row (sequence 3); nothing else moves
    assert runner.seq_ids == [0, 2, 3] and runner.slot_seqs == [0, 3, 2]
    assert (layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) == buffers
    assert torch.equal(layer.k_buf[0], first_slot)
    decode()
    prefill([4])  # into the freed slot, still without reallocating
    assert (layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) == buffers
    for _ in range(3):
        decode()
    assert layer.keys.shape[0] == 4 and layer.keys.shape[2] == runner.batch.kv.width
    for s, tokens in got.items():
        assert tokens == solo[s][:len(tokens)], f"sequence {s}"


def test_rows_leaving_together_say_where_the_last_rows_went(family):
    """The runner knows slots only: `remove` says which rows moved (the engine moves their records' slots), each
    leaving slot taking the last row still there, and a row that moved keeps its solo tokens."""
    prompts = [_prompt(family, n, seed) for seed, n in enumerate((5, 9, 4, 7, 6, 8))]
    solo = _solo(family, prompts[5], 4)
    runner = Rows(family)
    first = runner.prefill(list(range(6)), prompts)
    runner.remove({2, 4})
    assert runner.moved == {5: 2} and runner.slot_seqs == [0, 1, 5, 3]  # 4 takes 5, then 2 takes it; 3 stays
    assert runner.runner.remove([7]) == {} and runner.runner.rows == 4  # (past the rows: nothing to drop)
    tokens = {s: [int(first[s].argmax())] for s in runner.joined}
    for _ in range(4):
        step = runner.decode([tokens[s][-1] for s in runner.joined])
        for s, t in zip(runner.joined, step.argmax(-1).tolist(), strict=True):
            tokens[s].append(t)
    assert tokens[5] == solo


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lazily committed reservations are Linux's")
def test_reserved_buffers_never_move_and_cost_only_what_is_written(family):
    """With the engine's capacity the buffers are reserved at once (every running row up to the longest sequence):
    arrivals, a long prompt over several parts, leaves and decodes never reallocate them, the memory used is
    what is written (not the multi-GiB reservation), and every row keeps its solo tokens."""
    prompts = [_prompt(family, n, seed) for seed, n in enumerate((9, 30, 4, 700))]
    solo = [_solo(family, p, 12) for p in prompts]
    columns = 1 << 20  # 65 slots x 1M columns: GiBs per buffer if it were committed
    before = _rss_mib()
    runner = Rows(family, batch_capacity(64, columns - 1))
    got = {s: [t] for s, t in zip([0, 1], runner.prefill([0, 1], prompts[:2]).argmax(-1).tolist(), strict=True)}
    layer = runner.batch.kv.layers[0]
    assert layer.k_buf.shape[0] == 65 and layer.k_buf.shape[2] == columns
    buffers = layer.k_buf.data_ptr(), layer.v_buf.data_ptr()

    def decode_and(parts):
        rows = runner.seq_ids
        out, done = runner.mixed([got[s][-1] for s in rows], parts) if parts else (
            runner.decode([got[s][-1] for s in rows]), None)
        for s, t in zip(rows, out.argmax(-1).tolist(), strict=True):
            got[s].append(t)
        return done

    got[2] = decode_and([Part(2, prompts[2], 0, 4)]).argmax(-1).tolist()
    decode_and([])
    long = prompts[3]
    for start in range(0, 700, 256):  # the long prompt in three parts beside the decoding rows
        done = decode_and([Part(3, long if start == 0 else None, start, min(start + 256, 700))])
    got[3] = done.argmax(-1).tolist()
    runner.remove({1})
    for _ in range(5):
        decode_and([])
    assert (layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) == buffers
    assert _rss_mib() - before < 64
    for s, tokens in got.items():
        assert tokens == solo[s][:len(tokens)], f"sequence {s}"


def test_buffers_grow_past_the_capacity_keeping_what_was_written(family):
    """A capacity smaller than the batch (a left-padded row can outgrow the longest sequence) still works: the
    buffers grow, copying what every slot holds, and the rows keep their solo tokens."""
    prompts = [_prompt(family, n, seed) for seed, n in enumerate((5, 12, 40))]
    solo = [_solo(family, p, 30) for p in prompts]
    runner = Rows(family, (1, 8))
    got = {s: [t] for s, t in zip([0, 1], runner.prefill([0, 1], prompts[:2]).argmax(-1).tolist(), strict=True)}
    got[2] = runner.prefill([2], prompts[2:]).argmax(-1).tolist()
    for _ in range(30):
        rows = runner.seq_ids
        for s, t in zip(rows, runner.decode([got[s][-1] for s in rows]).argmax(-1).tolist(), strict=True):
            got[s].append(t)
    assert runner.batch.kv.layers[0].k_buf.shape[2] >= 70
    for s, tokens in got.items():
        assert tokens == solo[s][:len(tokens)], f"sequence {s}"


async def test_an_idle_engine_frees_its_batch_buffers_without_the_cyclic_collector(engines):
    """A slot layer and its SlotKV refer to each other: dropped as a pair, their reserved key/value pages waited for a
    full collection, which an idle engine never runs (its RSS stayed up after a burst)."""
    engine = engines("tiny-text")
    stream = engine.generate(text_request(random_ids(6, seed=17), "burst", max_tokens=8))
    await anext(stream)
    buffers = weakref.ref(next(iter(engine.runner.batch.kv.layers.values())).k_buf)
    gc.disable()
    try:
        async for _ in stream:
            pass
        await wait_until(lambda: engine.runner.batch is None, "the engine idle")
        assert buffers() is None
    finally:
        gc.enable()
