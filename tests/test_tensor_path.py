"""The tensor path: the one-pass finiteness check, assembly into preallocated buffers, and prompt embeddings
larger than one gRPC message going client -> preprocessor (Upload) -> engine (Generate) in bounded chunks.

The size thresholds are lowered here so small tensors take the streaming path in well under a second.
"""

from __future__ import annotations

import grpc
import pytest
import torch
from prometheus_client import REGISTRY

import clients.requests
import preprocessor.server
import splice.tensor_chunks
from clients import AsyncSpliceClient, SpliceClientError
from engine.config import EngineConfig
from engine.server import EngineServer
from preprocessor.limits import Limits
from preprocessor.server import PreprocessorServer
from splice.errors import InvalidArgument
from splice.request_rules import all_finite
from splice.tensor_assembly import Declared, TensorAssembly
from splice.tensors import byte_view


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_is_exact(dtype):
    big = torch.finfo(dtype).max
    assert all_finite(torch.randn(100, 8).to(dtype))
    assert all_finite(torch.full((64,), big, dtype=dtype))  # the sum overflows; every value is finite
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.zeros(50, 8, dtype=dtype)
        t[49, 7] = bad
        assert not all_finite(t)
    both = torch.tensor([float("inf"), float("-inf")], dtype=dtype)  # the sum is NaN, not Inf
    assert not all_finite(both)


def test_assembly_writes_into_declared_buffers_and_checks_counts():
    t = torch.randn(5, 3)
    data = bytes(byte_view(t))
    asm = TensorAssembly([Declared("x", torch.float32, (5, 3)), Declared("y", torch.int64, (2,))])
    for i in range(0, len(data), 7):
        asm.add(0, data[i:i + 7])
    asm.add(1, bytes(byte_view(torch.tensor([4, 5]))))
    x, y = asm.finish()
    assert torch.equal(x, t) and y.tolist() == [4, 5]
    asm = TensorAssembly([Declared("x", torch.float32, (2,)), Declared("y", torch.float32, (2,))])
    with pytest.raises(InvalidArgument, match="more bytes"):
        asm.add(0, b"\0" * 9)
    asm.add(0, b"\0" * 4)
    with pytest.raises(InvalidArgument, match="x: received 4 bytes, declared 8"):
        asm.add(1, b"\0" * 4)  # x is incomplete when y begins
    asm = TensorAssembly([Declared("x", torch.float32, (2,)), Declared("y", torch.float32, (2,))])
    asm.add(0, b"\0" * 8)
    asm.add(1, b"\0" * 8)
    with pytest.raises(InvalidArgument, match="after"):
        asm.add(0, b"\0")


@pytest.fixture
def small_messages(monkeypatch):
    """Messages of at most 16 KiB on both hops; the preprocessor refuses any message over 64 KiB and the
    clients stream any tensors over 4 KiB, so a 150 KiB tensor only gets through in chunks."""
    monkeypatch.setattr(splice.tensor_chunks, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(preprocessor.server, "MAX_RECEIVE_BYTES", 64 << 10)
    monkeypatch.setattr(clients.requests, "UPLOAD_THRESHOLD", 4 << 10)


@pytest.fixture
async def stack(tiny_dirs, small_messages):
    engine = EngineServer(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_name="tiny-text"))
    await engine.start()
    pre = PreprocessorServer(engine=engine.address, model=str(tiny_dirs["tiny-text"]), poll_interval=0.1,
                             limits=Limits(max_embeds_bytes=1 << 20))
    port = await pre.start()
    await pre.ready.wait()
    try:
        yield engine.engine, f"127.0.0.1:{port}"
    finally:
        await pre.stop(0)
        await engine.stop(0)


def _engine_calls(method: str) -> float:
    return REGISTRY.get_sample_value("splice_rpc_requests_total",
                                     {"service": "splice.v1.Engine", "method": method, "code": "OK"}) or 0.0


async def test_large_embeds_round_trip_through_both_hops(stack):
    engine, address = stack
    before = {m: _engine_calls(m) for m in ("Generate", "GenerateWhole", "Multiplex")}
    ids = torch.randint(40, 600, (600,), generator=torch.Generator().manual_seed(3))
    rows = engine.m.family.lookup(ids).detach()  # [600, 64] float32: 150 KiB, over every message limit here
    assert rows.numel() * 4 > 64 << 10
    greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=6)
    async with AsyncSpliceClient(address, timeout=60) as client:
        by_ids = [t for c in [c async for c in client.complete([ids.tolist()], **greedy)] for t in c.token_ids]
        by_rows = [t for c in [c async for c in client.complete([rows], **greedy)] for t in c.token_ids]
        # the same rows after a text part, as a Chat part: equal bytes, equal answers
        mixed = [t for c in [c async for c in client.complete(["Hi", rows], **greedy)] for t in c.token_ids]
        mixed_ids = [t for c in [c async for c in client.complete(["Hi", ids.tolist()], **greedy)] for t in c.token_ids]
    assert by_rows == by_ids and len(by_ids) == 6
    assert mixed == mixed_ids
    # the rows went to the engine as the chunked Generate stream; the IDs alone fit in one message, a call on the
    # preprocessor's Multiplex stream (one engine)
    assert {m: _engine_calls(m) - n for m, n in before.items()} == {"Generate": 2, "GenerateWhole": 0, "Multiplex": 2}


async def test_non_finite_streamed_embeds_are_rejected_naming_the_part(stack):
    _, address = stack
    rows = torch.randn(600, 64)
    rows[599, 3] = float("nan")
    async with AsyncSpliceClient(address, timeout=60) as client:
        with pytest.raises(SpliceClientError) as err:
            [c async for c in client.complete(["Hi", rows], max_tokens=2)]
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt[1]: prompt_embeds holds non-finite values" in err.value.details


async def test_streamed_embeds_over_the_cap_are_refused_before_allocation(stack):
    _, address = stack
    async with AsyncSpliceClient(address, timeout=60) as client:
        with pytest.raises(SpliceClientError) as err:
            [c async for c in client.complete([torch.zeros(4097, 64)], max_tokens=2)]  # 1 MiB + 256 bytes
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt[0]: prompt_embeds of shape [4097, 64] is 1048832 bytes; at most 1048576" in err.value.details
