"""prompt_embeds: the three encodings decode to the same rows; every rejection names the part."""

from __future__ import annotations

import base64
import io
import json
import struct

import pytest
import torch
from safetensors.torch import save as st_save

from preprocessor.content import Embeds, Where
from preprocessor.embeds import decode_embeds
from preprocessor.limits import Limits
from splice.errors import SpliceError
from tests.preprocessor.pp_factories import raw, rows

WHERE = Where(1, 2)


def _b64(obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


def _reject(part: Embeds, info, limits: Limits | None = None) -> SpliceError:
    with pytest.raises(SpliceError) as exc:
        decode_embeds(part, info, limits or Limits())
    assert exc.value.code == "INVALID_ARGUMENT"
    assert "messages[1].content[2]" in exc.value.message
    return exc.value


@pytest.fixture
def info(tiny):
    return tiny["tiny-text"][1]


def test_three_encodings_agree(info):
    x = rows(4, info.hidden_size)  # [4, hidden]
    for part in (Embeds("tensor", raw(x), WHERE), Embeds("torch_base64", _b64(x), WHERE),
                 Embeds("safetensors", st_save({"embeds": x}), WHERE),
                 Embeds("tensor", raw(x[None]), WHERE), Embeds("torch_base64", _b64(x[None]), WHERE)):
        got = decode_embeds(part, info, Limits())
        assert got.shape == (4, info.hidden_size) and torch.equal(got, x), part.encoding


def test_float64_is_cast_to_engine_dtype(info):
    x = rows(2, info.hidden_size).double()
    got = decode_embeds(Embeds("safetensors", st_save({"e": x}), WHERE), info, Limits())
    assert got.dtype == torch.float32 and torch.equal(got, x.float())


@pytest.mark.parametrize("encoding", ["tensor", "torch_base64", "safetensors"])
def test_non_float_rejected(info, encoding):
    x = torch.ones(2, info.hidden_size, dtype=torch.int64)
    payload = {"tensor": raw(x), "torch_base64": _b64(x), "safetensors": st_save({"e": x})}[encoding]
    err = _reject(Embeds(encoding, payload, WHERE), info)
    assert "float" in err.message and "int64" in err.message


def test_wrong_hidden_size_rejected(info):
    err = _reject(Embeds("tensor", raw(rows(2, info.hidden_size + 1)), WHERE), info)
    assert f"has {info.hidden_size + 1} columns, expected hidden size {info.hidden_size}" in err.message


def test_zero_rows_rejected(info):
    err = _reject(Embeds("tensor", raw(torch.empty(0, info.hidden_size)), WHERE), info)
    assert "0 rows" in err.message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rejected(info, bad):
    x = rows(3, info.hidden_size)
    x[1, 5] = bad
    err = _reject(Embeds("torch_base64", _b64(x), WHERE), info)
    assert "NaN or Inf" in err.message


def test_overflow_on_cast_rejected(info):
    from dataclasses import replace

    x = torch.full((1, info.hidden_size), 1e6)  # finite in float32, inf in float16
    err = _reject(Embeds("tensor", raw(x), WHERE), replace(info, dtype="float16"))
    assert "overflow" in err.message and "float16" in err.message


@pytest.mark.parametrize("shape", [[2, 3, 64], [64], [1, 1, 3, 64]])
def test_bad_rank_rejected(info, shape):
    err = _reject(Embeds("tensor", raw(torch.zeros(shape)), WHERE), info)
    assert str(shape) in err.message


def test_oversize_rejected_before_allocation(info):
    # The declared shape alone is over the cap: no bytes are sent, so only metadata can be checked.
    from preprocessor.content import RawTensor

    part = Embeds("tensor", RawTensor("float32", (1000, info.hidden_size), b""), WHERE)
    err = _reject(part, info, Limits(max_embeds_bytes=1 << 16))
    assert f"is {1000 * info.hidden_size * 4} bytes; at most 65536" in err.message


def test_more_rows_than_the_context_rejected_before_allocation(info):
    from preprocessor.content import RawTensor

    part = Embeds("tensor", RawTensor("float32", (info.max_model_len, info.hidden_size), b""), WHERE)
    err = _reject(part, info)
    assert f"{info.max_model_len} rows" in err.message and "max_model_len" in err.message


def test_expanded_view_rejected_before_densifying(info):
    # A stride-0 view saves a tiny storage but describes a large tensor; densifying it would allocate it all.
    x = torch.zeros(1, info.hidden_size).expand(1000, info.hidden_size)
    err = _reject(Embeds("torch_base64", _b64(x), WHERE), info)
    assert "view of a smaller storage" in err.message and "[1000," in err.message


def test_torch_base64_payload_size_capped(info):
    err = _reject(Embeds("torch_base64", "A" * (4 << 20), WHERE), info, Limits(max_embeds_bytes=1 << 20))
    assert "characters" in err.message


@pytest.mark.parametrize(("payload", "needle"), [
    ("not base64!!", "not valid base64"),
    (base64.b64encode(b"garbage").decode(), "not a torch.save zip archive"),
])
def test_torch_base64_garbage_rejected(info, payload, needle):
    assert needle in _reject(Embeds("torch_base64", payload, WHERE), info).message


def test_torch_base64_non_tensor_rejected(info):
    err = _reject(Embeds("torch_base64", _b64({"x": torch.zeros(2, 64)}), WHERE), info)
    assert "dict, not a tensor" in err.message


def test_torch_base64_sparse_rejected(info):
    x = torch.zeros(2, info.hidden_size)
    x[0, 0] = 1.0
    err = _reject(Embeds("torch_base64", _b64(x.to_sparse()), WHERE), info)
    assert "dense" in err.message


def test_torch_base64_arbitrary_objects_refused(info):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    err = _reject(Embeds("torch_base64", _b64(Evil()), WHERE), info)
    assert "weights_only=True" in err.message


def test_safetensors_two_tensors_rejected(info):
    blob = st_save({"a": rows(1, info.hidden_size), "b": rows(1, info.hidden_size)})
    assert "holds 2 tensors" in _reject(Embeds("safetensors", blob, WHERE), info).message


def test_safetensors_oversize_rejected_from_header(info):
    header = json.dumps({"e": {"dtype": "F32", "shape": [1000, info.hidden_size], "data_offsets": [0, 0]}})
    blob = struct.pack("<Q", len(header)) + header.encode()
    err = _reject(Embeds("safetensors", blob, WHERE), info, Limits(max_embeds_bytes=1 << 16))
    assert "at most 65536" in err.message


@pytest.mark.parametrize("blob", [b"", b"\xff" * 8 + b"{}", struct.pack("<Q", 2) + b"[]"])
def test_safetensors_malformed_rejected(info, blob):
    assert "safetensors" in _reject(Embeds("safetensors", blob, WHERE), info).message


def test_raw_tensor_byte_count_mismatch_rejected(info):
    from preprocessor.content import RawTensor

    part = Embeds("tensor", RawTensor("float32", (2, info.hidden_size), b"\0" * 12), WHERE)
    assert "expected" in _reject(part, info).message


def test_torch_base64_meta_and_nested_rejected(info):
    import warnings

    hidden = info.hidden_size
    assert "device 'meta'" in _reject(Embeds("torch_base64", _b64(torch.empty(2, hidden, device="meta")), WHERE),
                                      info).message
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (nested tensors are a prototype)
        for layout in (torch.strided, torch.jagged):
            nested = torch.nested.nested_tensor([torch.ones(2, hidden), torch.ones(3, hidden)], layout=layout)
            assert "dense tensor" in _reject(Embeds("torch_base64", _b64(nested), WHERE), info).message


def test_torch_base64_parameter_accepted(info):
    x = rows(3, info.hidden_size)
    got = decode_embeds(Embeds("torch_base64", _b64(torch.nn.Parameter(x)), WHERE), info, Limits())
    assert torch.equal(got, x)


def _rezip(blob: bytes, **changes) -> bytes:
    """`blob`'s records rewritten by zipfile (stored unless `compress` names them; `tail` appended)."""
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(blob))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            method = zipfile.ZIP_DEFLATED if info.filename in changes.get("compress", ()) else zipfile.ZIP_STORED
            dst.writestr(info.filename, src.read(info), compress_type=method)
    return changes.get("head", b"") + out.getvalue() + changes.get("tail", b"")


def test_torch_base64_compressed_storage_rejected_before_inflating(info):
    from tests.harness.hostile_files import deflated_torch_save

    # Row 2 of issue 27: 1.4 MB of base64 whose storage inflates to 1 GiB under a [4, 64] view.
    err = _reject(Embeds("torch_base64", base64.b64encode(deflated_torch_save((4, 64))).decode(), WHERE), info)
    assert "'archive/data/0' is compressed" in err.message
    # The same for a small one: no compressed record is read, whatever it inflates to.
    blob = _rezip(base64.b64decode(_b64(rows(2, info.hidden_size))), compress={"archive/data/0"})
    assert "is compressed" in _reject(Embeds("torch_base64", base64.b64encode(blob).decode(), WHERE), info).message


def test_torch_base64_storage_over_the_cap_rejected_from_the_directory(info):
    err = _reject(Embeds("torch_base64", _b64(rows(64, info.hidden_size)), WHERE), info,
                  Limits(max_embeds_bytes=64 * info.hidden_size * 4 - 1))
    assert "record 'archive/data/0' is" in err.message and "at most" in err.message


def test_torch_base64_view_of_a_larger_storage_accepted_within_the_cap(info):
    # torch.save keeps a slice's whole storage: it was sent, stored, so it is taken (as vLLM takes it) while that
    # storage is within the cap, which the archive's directory says before anything is read.
    x = rows(10, info.hidden_size)[:4]  # [4, hidden] of a [10, hidden] storage
    got = decode_embeds(Embeds("torch_base64", _b64(x), WHERE), info, Limits())
    assert torch.equal(got, x) and got.untyped_storage().nbytes() == x.numel() * 4
    err = _reject(Embeds("torch_base64", _b64(x), WHERE), info, Limits(max_embeds_bytes=5 * info.hidden_size * 4))
    assert "record 'archive/data/0' is" in err.message


@pytest.mark.parametrize("change", [{"tail": b"\0"}, {"head": b"\0" * 4}, {"tail": b"PK\x05\x06" + b"\0" * 18}])
def test_torch_base64_archive_layout_must_be_unambiguous(info, change):
    blob = _rezip(base64.b64decode(_b64(rows(2, info.hidden_size))), **change)
    err = _reject(Embeds("torch_base64", base64.b64encode(blob).decode(), WHERE), info)
    assert "torch_base64" in err.message
    plain = _rezip(base64.b64decode(_b64(rows(2, info.hidden_size))))  # zipfile's own layout is fine
    assert decode_embeds(Embeds("torch_base64", base64.b64encode(plain).decode(), WHERE), info, Limits()).shape[0] == 2


@pytest.mark.parametrize("encoding", ["tensor", "torch_base64", "safetensors"])
def test_decoding_is_charged_to_the_requests_admission(info, encoding):
    from preprocessor.admission import Admission

    x = rows(16, info.hidden_size).half()  # [16, hidden] float16 -> float32 rows
    payload = {"tensor": raw(x), "torch_base64": _b64(x), "safetensors": st_save({"e": x})}[encoding]
    part = Embeds(encoding, payload, WHERE)
    source, out = 16 * info.hidden_size * 2, 16 * info.hidden_size * 4
    if encoding == "tensor":
        expected = source + out  # the copy of the message's bytes, the rows
    elif encoding == "torch_base64":
        expected = len(payload) * 3 // 4 + source + out  # the archive, its storage, the rows
    else:
        expected = 2 * source + out  # the slice of the file, its copy, the rows
    admission = Admission(max_bytes=1 << 20)
    ticket = admission.enter(100)  # as the call guard does: this context's request
    try:
        decode_embeds(part, info, Limits())
        assert admission.held == 100 + expected
    finally:
        ticket.release()
    admission = Admission(max_bytes=expected)
    ticket = admission.enter(100)
    try:
        with pytest.raises(SpliceError) as exc:
            decode_embeds(part, info, Limits())
        assert exc.value.code == "RESOURCE_EXHAUSTED" and "messages[1].content[2]: decoding prompt_embeds" in \
            exc.value.message and "--max-inflight-request-bytes" in exc.value.message
    finally:
        ticket.release()
