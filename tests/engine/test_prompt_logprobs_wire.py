"""Prompt logprobs and logprob_token_ids on the wire: SamplingParams' fields round-trip, a long prompt's logprobs
travel as pieces (each message small) and are joined again, over a real engine gRPC server in-process."""

from __future__ import annotations

import grpc
import pytest
import pytest_asyncio

import splice.prompt_logprobs as wire
from engine.config import EngineConfig
from engine.server import EngineServer
from preprocessor.engine_client import EngineClient
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_wire import encode_request
from splice.errors import InvalidArgument
from splice.prompt_logprobs import Pieces, PromptLogprobs
from splice.sampling import SamplingParams
from splice.v1 import engine_pb2_grpc
from tests.engine.engine_factories import random_ids, text_request

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

WHOLE = PromptLogprobs((5, 6, 7, 8, 9), (-1.0, -2.0, -3.0, -4.0), (3, 1, 2, 9),  # values exact in float32
                       (6, 1, 7, 2, 3, 7, 4, 5), (-1.5, -1.625, -2.0, -2.5, -2.875, -3.0, -0.5, -0.625))


def test_sampling_fields_round_trip_and_their_bounds():
    params = SamplingParams(logprobs=True, prompt_logprobs=0, logprob_token_ids=[4, 2, 4])
    back = SamplingParams.from_pb(params.to_pb())
    assert back == params and back.prompt_logprobs == 0 and back.logprob_token_ids == (4, 2, 4)
    assert SamplingParams.from_pb(SamplingParams().to_pb()).prompt_logprobs is None
    assert params.skip_reading_prefix_cache and not SamplingParams().skip_reading_prefix_cache
    for bad, match in [(dict(prompt_logprobs=21), "prompt_logprobs must be in \\[0, 20\\]"),
                       (dict(prompt_logprobs=-1), "prompt_logprobs must be in"),
                       (dict(logprob_token_ids=(1,)), "logprob_token_ids needs logprobs"),
                       (dict(logprobs=True, logprob_token_ids=tuple(range(129))), "at most 128"),
                       (dict(logprobs=True, logprob_token_ids=(-1,)), "logprob_token_ids\\[0\\] must be in"),
                       (dict(logprobs=True, top_logprobs=2, logprob_token_ids=(1,)), "must be 0 or len")]:
        with pytest.raises(InvalidArgument, match=match):
            SamplingParams(**bad)
    assert SamplingParams(logprobs=True, top_logprobs=2, logprob_token_ids=(1, 5)).top_logprobs == 2  # vLLM's rule


def test_pieces_split_and_join_back():
    assert WHOLE.k == 2 and WHOLE.split(5) == [WHOLE]
    pieces = WHOLE.split(2)
    assert [p.first for p in pieces] == [0, 2, 4] and [p.token_ids for p in pieces] == [(5, 6), (7, 8), (9,)]
    assert [len(p.logprobs) for p in pieces] == [1, 2, 1]  # position 0 has none
    assert PromptLogprobs.join(pieces) == WHOLE
    assert [PromptLogprobs.from_pb(p.to_pb()) for p in pieces] == pieces
    with pytest.raises(ValueError, match="expected 2"):
        PromptLogprobs.join([pieces[0], pieces[2]])
    assert WHOLE.entries()[0] is None and WHOLE.entries()[2] == (7, -2.0, 1, ((7, -2.0), (2, -2.5)))


def test_an_output_with_long_prompt_logprobs_goes_as_pieces_then_the_token(monkeypatch):
    monkeypatch.setattr(wire, "PIECE_POSITIONS", 2)
    out = EngineOutput((11,), (-0.1,), FinishReason.LENGTH, Usage(5, 1), prompt_logprobs=WHOLE)
    pbs = out.to_pbs()
    assert [list(pb.token_ids) for pb in pbs] == [[], [], [11]]
    assert all(pb.HasField("prompt_logprobs") for pb in pbs)
    pieces = Pieces()
    for pb in pbs:
        pieces.add(EngineOutput.from_pb(pb).prompt_logprobs)
    assert pieces.take() == WHOLE and pieces.take() is None
    assert EngineOutput.merge([EngineOutput((1,), prompt_logprobs=WHOLE), EngineOutput((2,))]).prompt_logprobs == WHOLE
    assert EngineOutput((3,)).to_pbs()[0].HasField("prompt_logprobs") is False


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_dirs):
    srv = EngineServer(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_name="tiny-text"))
    await srv.listen()
    await srv.load()
    yield srv
    await srv.stop(grace=1)


@ON_MODULE_LOOP
async def test_a_long_prompts_logprobs_cross_the_engine_hop_in_pieces(server, monkeypatch):
    monkeypatch.setattr(wire, "PIECE_POSITIONS", 8)  # the server runs in this process: its messages split too
    ids = random_ids(30, seed=5)
    req = text_request(ids, "long", max_tokens=2, prompt_logprobs=3)
    alone = [o async for o in server.engine.generate(req)]
    local = alone[0].prompt_logprobs
    async with grpc.aio.insecure_channel(server.address) as ch:
        raw = [r async for r in engine_pb2_grpc.EngineStub(ch).Generate(encode_request(req))]
    # 3 pieces alone, the 4th with the first token; the second token comes after it or, when the reader was slower
    # than the engine, merged into that same message by the outbox (engine/outbox.py): both are right
    counts = [len(r.token_ids) for r in raw]
    assert counts[:3] == [0, 0, 0] and counts[3] >= 1 and sum(counts) == 2, counts
    assert [r.prompt_logprobs.first_position for r in raw[:4]] == [0, 8, 16, 24]
    assert not any(r.HasField("prompt_logprobs") for r in raw[4:])
    client = EngineClient(server.address)
    try:
        outs = [o async for o in client.generate(req)]
    finally:
        await client.close()
    assert outs[0].token_ids and outs[0].prompt_logprobs == local and len(local.token_ids) == 30
    assert all(o.prompt_logprobs is None for o in outs[1:])
