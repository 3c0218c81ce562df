"""Unit tests of the shared wire pieces: sampling defaults, tensor codec, request chunking, engine outputs."""

from __future__ import annotations

import pytest
import torch

from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.engine_wire import RequestAssembler, encode_header, encode_request, encode_whole
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from splice.tensors import from_bytes, tensor_from_pb, tensor_to_pb
from splice.v1 import common_pb2, engine_pb2


def test_sampling_defaults_applied_for_unset_optionals():
    params = SamplingParams.from_pb(common_pb2.SamplingParams())
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (1.0, 1.0, 0, None, None)
    assert params.skip_special_tokens is True
    greedy = SamplingParams.from_pb(common_pb2.SamplingParams(temperature=0.0, max_tokens=5, seed=7))
    assert greedy.greedy and greedy.max_tokens == 5 and greedy.seed == 7
    assert SamplingParams.from_pb(greedy.to_pb()) == greedy


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("temperature", -0.5, "temperature"), ("temperature", float("nan"), "temperature"),
    ("top_p", 0.0, "top_p"), ("top_p", 1.5, "top_p"), ("top_k", -1, "top_k"), ("max_tokens", 0, "max_tokens"),
])
def test_sampling_rejects_bad_values(field, value, needle):
    with pytest.raises(InvalidArgument, match=needle):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensor_roundtrip(dtype):
    t = (torch.arange(24).reshape(2, 3, 4) % 5).to(dtype)
    back = tensor_from_pb(tensor_to_pb(t))
    assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_tensor_byte_count_checked():
    with pytest.raises(InvalidArgument, match="expected 24"):
        from_bytes(b"\0" * 20, torch.float32, [2, 3])


def _request(rows: tuple[int, ...] = (3, 5)) -> EngineRequest:
    g = torch.Generator().manual_seed(0)
    tensors = [NamedTensor(PROMPT_EMBEDS, torch.randn(n, 64, generator=g)) for n in rows]
    tensors.append(NamedTensor("pixel_values", torch.randn(1, 3, 3, 32, 32, generator=g)))
    return EngineRequest("r1", list(range(20)), [EmbedSpan(2, 3, 0), EmbedSpan(9, 5, 1)], tensors,
                         SamplingParams(temperature=0.0, max_tokens=4))


def test_request_chunks_are_bounded_and_reassemble_exactly():
    req = _request()
    parts = list(encode_request(req, chunk_bytes=100))
    assert parts[0].WhichOneof("part") == "header"
    assert all(len(p.chunk.data) <= 100 for p in parts[1:])
    asm = RequestAssembler()
    for p in parts:
        asm.feed(p)
    back = asm.finish()
    assert back.token_ids == req.token_ids and back.embed_spans == req.embed_spans and back.sampling == req.sampling
    for a, b in zip(back.tensors, req.tensors, strict=True):
        assert a.name == b.name and torch.equal(a.tensor, b.tensor)
    assert set(back.model_inputs) == {"pixel_values"}


def test_a_request_that_fits_goes_whole_with_one_chunk_per_tensor_and_reassembles_exactly():
    req = _request()
    header = encode_header(req)
    whole = encode_whole(req, header)
    assert whole is not None and whole.ByteSize() <= 1 << 20
    assert [p.WhichOneof("part") for p in whole.parts] == ["header"] + ["chunk"] * len(req.tensors)
    assert [p.chunk.tensor_index for p in whole.parts[1:]] == list(range(len(req.tensors)))
    asm = RequestAssembler()
    assert not asm.complete
    asm.feed(whole.parts[0])
    for p in whole.parts[1:]:
        assert not asm.complete  # declared bytes still missing
        asm.feed(p)
    assert asm.complete
    back = asm.finish()
    assert back.token_ids == req.token_ids and back.embed_spans == req.embed_spans and back.sampling == req.sampling
    for a, b in zip(back.tensors, req.tensors, strict=True):
        assert a.name == b.name and torch.equal(a.tensor, b.tensor)
    # larger than the bound: None, and the stream carries it
    tensor_bytes = sum(t.tensor.numel() * t.tensor.element_size() for t in req.tensors)
    assert encode_whole(req, header, max_bytes=tensor_bytes) is None
    assert encode_whole(req, header, max_bytes=whole.ByteSize() + 1024) is not None  # the bound is conservative


def test_a_header_declaring_no_tensor_bytes_is_complete_at_once():
    asm = RequestAssembler()
    asm.feed(encode_header(EngineRequest("t", [1, 2, 3])))
    assert asm.complete and asm.finish().token_ids == [1, 2, 3]


def test_assembler_rejects_truncated_and_misordered_streams():
    parts = list(encode_request(_request(), chunk_bytes=256))
    asm = RequestAssembler()
    for p in parts[:-1]:
        asm.feed(p)
    with pytest.raises(InvalidArgument, match="received"):
        asm.finish()
    asm = RequestAssembler()
    with pytest.raises(InvalidArgument, match="before the header"):
        asm.feed(parts[1])
    asm = RequestAssembler()
    asm.feed(parts[0])
    with pytest.raises(InvalidArgument, match="declared"):
        asm.feed(engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=9, data=b"x")))


def test_assembler_caps_declared_size_before_allocating():
    header = engine_pb2.GenerateHeader(tensors=[engine_pb2.TensorMeta(name=PROMPT_EMBEDS, dtype="float32",
                                                                      shape=[1 << 20, 1 << 12])])
    with pytest.raises(InvalidArgument, match="at most"):
        RequestAssembler(max_request_bytes=1 << 30).feed(engine_pb2.GenerateRequestPart(header=header))


def test_engine_output_roundtrip_and_only_stop_or_length_on_the_wire():
    step = EngineOutput((5,), (-0.25,))
    assert EngineOutput.from_pb(step.to_pb()) == step and not step.to_pb().HasField("usage")
    last = EngineOutput((7, 8), finish_reason=FinishReason.LENGTH, usage=Usage(3, 9))
    pb = last.to_pb()
    assert pb.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (pb.usage.prompt_tokens, pb.usage.completion_tokens) == (3, 9)
    assert EngineOutput.from_pb(pb) == last and last.finish_reason == "length"
    assert EngineOutput((1,), finish_reason="stop").finish_reason is FinishReason.STOP  # a plain string is taken
    for internal in (FinishReason.ABORT, FinishReason.ERROR):
        with pytest.raises(ValueError, match="status"):
            internal.to_pb()
        with pytest.raises(ValueError, match="status"):
            EngineOutput((), finish_reason=internal)
    assert FinishReason.from_pb(common_pb2.FINISH_REASON_UNSPECIFIED) is None
    assert f"{FinishReason.STOP}" == "stop"  # CLI output and metrics labels print the value


def test_every_control_survives_the_wire_and_top_logprobs_merge_in_order():
    params = SamplingParams(temperature=0.5, presence_penalty=0.5, frequency_penalty=-1.5, repetition_penalty=1.25,
                            min_p=0.5, min_tokens=3, max_tokens=9, logit_bias={7: -100.0, 3: 2.5},
                            allowed_token_ids=(1, 2, 3), bad_words=("no",), bad_words_token_ids=((4,), (5, 6)),
                            include_stop_str_in_output=True, logprobs=True, top_logprobs=2)
    assert SamplingParams.from_pb(params.to_pb()) == params
    assert SamplingParams.from_pb(SamplingParams().to_pb()) == SamplingParams()  # every control off when unset
    a = EngineOutput((5,), (-0.5,), top_ids=(5, 9), top_logprobs=(-0.5, -1.0))
    b = EngineOutput((6,), (-0.25,), FinishReason.STOP, Usage(2, 2), (6, 1), (-0.25, -2.0))
    assert EngineOutput.from_pb(b.to_pb()) == b
    merged = EngineOutput.merge([a, b])
    assert merged.top_ids == (5, 9, 6, 1) and merged.top_logprobs == (-0.5, -1.0, -0.25, -2.0)


@pytest.mark.parametrize(("field", "value"), [
    ("presence_penalty", 2.5), ("frequency_penalty", float("nan")), ("repetition_penalty", 0.0),
    ("repetition_penalty", float("inf")), ("min_p", 1.01), ("min_tokens", -1), ("logit_bias", {5: 100.5}),
    ("logit_bias", {-1: 1.0}), ("allowed_token_ids", (2**31,)), ("top_logprobs", 21), ("bad_words", ("",)),
    ("bad_words_token_ids", ((),)),
])
def test_controls_out_of_range_are_refused_by_name(field, value):
    with pytest.raises(InvalidArgument, match=field):
        SamplingParams(**{field: value, "logprobs": True})


def test_n_travels_and_each_choice_samples_with_seed_plus_its_index():
    params = SamplingParams(n=3, seed=40, temperature=0.5)
    assert SamplingParams.from_pb(params.to_pb()) == params
    assert not SamplingParams().to_pb().HasField("n") and SamplingParams.from_pb(common_pb2.SamplingParams()).n == 1
    assert [params.choice(i).seed for i in range(3)] == [40, 41, 42]  # vLLM's parallel_sampling: seed + index
    assert params.choice(2) == SamplingParams(seed=42, temperature=0.5)  # n = 1, the rest unchanged
    assert SamplingParams(n=2).choice(1).seed is None
    for n in (0, 129):
        with pytest.raises(InvalidArgument, match=r"sampling\.n must be in \[1, 128\]"):
            SamplingParams(n=n)
    SamplingParams(n=128, seed=2**63 - 128)  # the last choice's seed is the largest one allowed
    with pytest.raises(InvalidArgument, match=r"seed \+ n - 1"):
        SamplingParams(n=128, seed=2**63 - 127)


def test_outputs_of_different_choices_never_merge():
    out = EngineOutput((4,), index=2, finish_reason=FinishReason.STOP, usage=Usage(3, 1))
    assert EngineOutput.from_pb(out.to_pb()) == out
    assert EngineOutput.merge([EngineOutput((3,), index=2), out]).index == 2
    with pytest.raises(ValueError, match="one choice"):
        EngineOutput.merge([EngineOutput((3,), index=1), out])
