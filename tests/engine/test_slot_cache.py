"""engine/models/slot_cache.py through the runner (tiny-text): rows join into free slots and leave by taking the last
row into their slot, without reallocating or moving the others; every row keeps its solo tokens."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner
from splice.engine_request import EngineRequest


@pytest.fixture(scope="module")
def family(tiny_dirs):
    return load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family


def _prompt(family, n: int, seed: int):
    ids = torch.randint(40, 600, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return family.prompt(EngineRequest(f"p{seed}", ids))


def _solo(family, prompt, steps: int) -> list[int]:
    runner = ModelRunner(family)
    tokens = runner.prefill([0], [prompt]).argmax(-1).tolist()
    for _ in range(steps):
        tokens += runner.decode(tokens[-1:]).argmax(-1).tolist()
    return tokens


def test_rows_join_and_leave_in_place_with_their_solo_tokens(family):
    prompts = [_prompt(family, n, seed) for seed, n in enumerate((7, 19, 3, 11, 5))]
    solo = [_solo(family, p, 8) for p in prompts]
    runner = ModelRunner(family)
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
    assert runner.seq_ids == [0, 2, 3] and runner.batch.slot_seqs == [0, 3, 2]
    assert (layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) == buffers
    assert torch.equal(layer.k_buf[0], first_slot)
    decode()
    prefill([4])  # into the freed slot, still without reallocating
    assert (layer.k_buf.data_ptr(), layer.v_buf.data_ptr()) == buffers
    for _ in range(3):
        decode()
    assert layer.keys.shape[0] == 4 and layer.keys.shape[2] == runner.batch.width
    for s, tokens in got.items():
        assert tokens == solo[s][:len(tokens)], f"sequence {s}"
