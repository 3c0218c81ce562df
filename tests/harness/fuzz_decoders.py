"""Property-based fuzzing (hypothesis) of the preprocessor's decoders of caller bytes: vLLM's torch.save
prompt_embeds, safetensors prompt_embeds, and images. Every input must end in a clean refusal (a SpliceError
with a client status: INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED) or a success; anything else
(another exception, a crash of the process) is a finding. Seeded with valid files and with hostile ones
(hostile_files.py: a deflate-compressed storage declaring 1 GiB, a 16,000,000 x 1 PNG, EPS; meta and nested tensors),
then mutated at the byte, zip-record, pickle and header level.

Runs in its caller's process, no services. tests/preprocessor/test_fuzz_decoders.py runs a short batch;
bench/fuzz_decoders.py runs batches for minutes and prints counts per decoder and outcome.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as seed_
from hypothesis import strategies as st

from preprocessor.content import Embeds, Image, RawTensor, Where
from preprocessor.embeds import decode_embeds
from preprocessor.images import load_image
from preprocessor.limits import Limits
from splice.errors import SpliceError
from splice.model_info import PROMPT_EMBEDS, TEXT, ModelInfo
from tests.harness.hostile_files import EPS, deflated_torch_save, png_header_only, torch_save, write_zip

CLEAN = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}
WHERE = Where(0, 1)
HIDDEN = 64
INFO = ModelInfo(model="fuzz", architecture="LlamaForCausalLM", vocab_rows=1000, hidden_size=HIDDEN, dtype="float32",
                 max_model_len=4096, image_token_id=None, input_kinds=(TEXT, PROMPT_EMBEDS), eos_token_ids=(2,))
# Small caps keep every accepted input cheap: the fuzzer looks for wrong answers, not for slow ones.
LIMITS = Limits(max_embeds_bytes=1 << 20, max_image_pixels=1 << 20)


# -- seeds ----------------------------------------------------------------------------------------------------------

def _seeds_torch() -> list[bytes]:
    x = torch.randn(3, HIDDEN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2, HIDDEN), torch.ones(1, HIDDEN)])
    sparse = torch.zeros(2, HIDDEN)
    sparse[0, 1] = 1.0
    return [torch_save(x), torch_save(x[None]), torch_save(x.half()), torch_save(x.bfloat16()),
            torch_save(torch.nn.Parameter(x)), torch_save(torch.zeros(8, HIDDEN)[:2]),
            torch_save(torch.zeros(1, HIDDEN).expand(50, HIDDEN)), torch_save(torch.empty(2, HIDDEN, device="meta")),
            torch_save(nested), torch_save(sparse.to_sparse()), torch_save(x.long()), torch_save({"e": x}),
            torch_save([x, x]), torch_save(torch.tensor(1.0)), deflated_torch_save((4, HIDDEN), 16 << 20)]


def _seeds_safetensors() -> list[bytes]:
    from safetensors.torch import save

    x = torch.randn(3, HIDDEN)
    return [save({"e": x}), save({"e": x.half()}), save({"e": x[None].contiguous()}), save({"a": x, "b": x.clone()}),
            save({"e": x.long()}), save({"e": x}, metadata={"format": "pt"})]


def _seeds_images() -> list[bytes]:
    from PIL import Image as PILImage

    out = []
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        buf = io.BytesIO()
        PILImage.new("RGB", (9, 7), (200, 30, 90)).save(buf, format=fmt)
        out.append(buf.getvalue())
    return [*out, EPS, png_header_only(16_000_000, 1), png_header_only(3000, 1), png_header_only(1, 3000)]


# -- mutations ------------------------------------------------------------------------------------------------------

_edits = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete", "truncate"]), st.floats(0, 1),
                            st.integers(0, 255)), min_size=1, max_size=6)


def _mutate(data: bytes, edits: list[tuple[str, float, int]]) -> bytes:
    out = bytearray(data)
    for op, where, value in edits:
        i = min(int(where * len(out)), max(len(out) - 1, 0))
        if op == "set" and out:
            out[i] = value
        elif op == "insert":
            out.insert(i, value)
        elif op == "delete" and out:
            del out[i]
        elif op == "truncate":
            del out[i:]
    return bytes(out)


def _records(blob: bytes) -> list[tuple[str, int, bytes, int, int]]:
    src = zipfile.ZipFile(io.BytesIO(blob))
    return [(i.filename, i.compress_type, src.open(i).read() if i.compress_type == zipfile.ZIP_STORED else b"",
             i.CRC, i.file_size) for i in src.infolist()]


@st.composite
def torch_archives(draw, seeds: list[bytes]) -> bytes:
    """A seed, mutated as bytes, or rebuilt with one record's bytes (the pickle, a storage), method or size
    mutated (with a matching CRC, so that the mutation reaches the reader behind it)."""
    blob = draw(st.sampled_from(seeds))
    how = draw(st.sampled_from(["bytes", "record", "record", "method", "size", "as is"]))
    if how == "bytes":
        return _mutate(blob, draw(_edits))
    if how == "as is":
        return blob
    try:
        records = _records(blob)
    except Exception:
        return blob
    k = draw(st.integers(0, len(records) - 1))
    name, method, data, crc, size = records[k]
    if how == "record":
        data = _mutate(data, draw(_edits))
        crc, size = zlib.crc32(data), len(data)
    elif how == "method":
        method = draw(st.sampled_from([zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, 99]))
    else:
        size = draw(st.sampled_from([0, size + 1, max(size - 1, 0), 1 << 31, 0xFFFFFFFF]))
    records[k] = (name, method, data, crc, size)
    return write_zip(records)


@st.composite
def safetensors_files(draw, seeds: list[bytes]) -> bytes:
    """A seed, mutated as bytes, or with its header's dtype, shape or offsets replaced."""
    blob = draw(st.sampled_from(seeds))
    if draw(st.booleans()):
        return _mutate(blob, draw(_edits))
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    name = next(k for k in header if k != "__metadata__")
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    values = {"dtype": st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "X", 3, None]),
              "shape": st.lists(st.integers(-2, 1 << 40), max_size=4) | st.just("3"),
              "data_offsets": st.lists(st.integers(-5, 1 << 40), max_size=3)}
    header[name][field] = draw(values[field])
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@st.composite
def images(draw, seeds: list[bytes]) -> bytes:
    """A seed, mutated anywhere or in its first 64 bytes (where headers declare sizes and formats)."""
    blob = draw(st.sampled_from(seeds))
    edits = draw(_edits)
    if draw(st.booleans()):
        head, tail = blob[:64], blob[64:]
        return _mutate(head, edits) + tail
    return _mutate(blob, edits)


@st.composite
def raw_tensors(draw) -> tuple[str, list[int], bytes]:
    """(dtype, shape, data) of the gRPC-native form: often [n, HIDDEN] with the right byte count, else anything."""
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16", "float64", "int64", "bool", "qint8", ""]))
    if draw(st.booleans()):
        shape = [draw(st.integers(0, 8)), HIDDEN]
        size = {"float32": 4, "float64": 8, "int64": 8, "bool": 1}.get(dtype, 2) * shape[0] * HIDDEN
        return dtype, shape, _mutate(bytes(size), draw(_edits)) if draw(st.booleans()) else bytes(size)
    return dtype, draw(st.lists(st.integers(-1, 1 << 33), max_size=4)), draw(st.binary(max_size=1024))


# -- the fuzzer ------------------------------------------------------------------------------------------------------

class DecoderFuzzer:
    """One hypothesis property per decoder: each drawn input must decode or be refused cleanly."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.findings: list[str] = []
        torch_seeds, st_seeds, image_seeds = _seeds_torch(), _seeds_safetensors(), _seeds_images()
        self.decoders: dict[str, tuple[st.SearchStrategy, Callable[[object], object]]] = {
            "torch_base64": (torch_archives(torch_seeds), lambda blob: decode_embeds(
                Embeds("torch_base64", base64.b64encode(blob).decode(), WHERE), INFO, LIMITS)),
            "safetensors": (safetensors_files(st_seeds), lambda blob: decode_embeds(
                Embeds("safetensors", blob, WHERE), INFO, LIMITS)),
            "tensor": (raw_tensors(), lambda t: decode_embeds(
                Embeds("tensor", RawTensor(t[0], tuple(t[1]), t[2]), WHERE), INFO, LIMITS)),
            "image": (images(image_seeds), lambda blob: load_image(Image("data", blob, WHERE), LIMITS)),
        }

    def check(self, decoder: str, value: object) -> None:
        """Raises whatever is not a success or a clean refusal (hypothesis then shrinks it)."""
        try:
            self.decoders[decoder][1](value)
            outcome = "OK"
        except SpliceError as exc:
            if exc.code not in CLEAN:
                raise
            outcome = exc.code
        self.counts[(decoder, outcome)] += 1

    def run(self, examples: int, seed: int, raise_findings: bool = True) -> None:
        for name in self.decoders:
            try:
                self._batch(name, examples, seed)
            except Exception as exc:  # a finding: the shrunk input's exception
                if raise_findings:
                    raise
                self.findings.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")

    def _batch(self, name: str, examples: int, seed: int) -> None:
        @seed_(seed)
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                  print_blob=False)
        @given(self.decoders[name][0])
        def one(value):
            self.check(name, value)

        one()
