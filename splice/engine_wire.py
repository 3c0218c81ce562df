"""EngineRequest <-> the Generate client stream (a header, then bounded tensor chunks), or the same parts whole in
one GenerateWhole message when they fit in one chunk's size.

Structural checks live here (header first, declared sizes, chunk order, byte counts); what the IDs and
spans mean is checked by the engine's validator.
"""

from __future__ import annotations

from collections.abc import Iterator

from splice import tensor_chunks as chunking
from splice.engine_request import EmbedSpan, EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from splice.tensor_assembly import Declared, TensorAssembly
from splice.tensors import dtype_from_name, dtype_name
from splice.v1 import common_pb2, engine_pb2

MAX_TENSORS = 64
MAX_REQUEST_BYTES = 1 << 30
_PART_OVERHEAD = 16  # bytes a part adds around its header or chunk (tags, lengths, the tensor index)


def encode_header(req: EngineRequest) -> engine_pb2.GenerateRequestPart:
    header = engine_pb2.GenerateHeader(
        request_id=req.request_id,
        token_ids=req.token_ids,
        embed_spans=[common_pb2.EmbedSpan(offset=s.offset, length=s.length, tensor_index=s.tensor_index)
                     for s in req.embed_spans],
        tensors=[engine_pb2.TensorMeta(name=t.name, dtype=dtype_name(t.tensor.dtype), shape=list(t.tensor.shape))
                 for t in req.tensors],
        sampling=req.sampling.to_pb(),
        model_fingerprint=req.model_fingerprint,
        lora_name=req.lora,
    )
    return engine_pb2.GenerateRequestPart(header=header)


def encode_request(req: EngineRequest, chunk_bytes: int | None = None,
                   header: engine_pb2.GenerateRequestPart | None = None) -> Iterator[engine_pb2.GenerateRequestPart]:
    """The Generate stream's parts, each built when asked for; `header`: encode_header(req), if already built."""
    yield header or encode_header(req)
    for chunk in chunking.tensor_chunks([t.tensor for t in req.tensors], chunk_bytes):
        yield engine_pb2.GenerateRequestPart(chunk=chunk)


def encode_whole(req: EngineRequest, header: engine_pb2.GenerateRequestPart,
                 max_bytes: int | None = None) -> engine_pb2.GenerateRequest | None:
    """`req` as one GenerateWhole message (its header, then one chunk per tensor), or None when it would be larger
    than `max_bytes`: then it goes as the Generate stream. `header`: encode_header(req). The bound defaults to the
    stream's chunk size (splice.tensor_chunks.CHUNK_BYTES), so the whole message stays as far below gRPC's message
    limits as the stream's parts do."""
    max_bytes = max_bytes or chunking.CHUNK_BYTES
    sizes = [t.tensor.numel() * t.tensor.element_size() for t in req.tensors]
    if header.ByteSize() + sum(sizes) + _PART_OVERHEAD * (len(sizes) + 1) > max_bytes:
        return None
    return engine_pb2.GenerateRequest(parts=list(encode_request(req, max(sizes, default=1) or 1, header)))


class RequestAssembler:
    """Feeds on GenerateRequestPart messages; `finish()` returns the EngineRequest. Tensor bytes are written
    into buffers of the declared sizes, allocated once the header's total passed the cap."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self._max_bytes = max_request_bytes
        self._header: engine_pb2.GenerateHeader | None = None
        self._tensors: TensorAssembly | None = None

    @property
    def declared_bytes(self) -> int:
        """Total tensor bytes the header announced (0 before the header)."""
        return sum(d.nbytes for d in self._tensors.declared) if self._tensors else 0

    @property
    def complete(self) -> bool:
        """The header and every tensor byte it declared have arrived: the request is whole, and anything more
        on the stream is a protocol error."""
        return self._tensors is not None and self._tensors.complete

    def feed(self, part: engine_pb2.GenerateRequestPart) -> None:
        kind = part.WhichOneof("part")
        if kind == "header":
            self._on_header(part.header)
        elif kind == "chunk":
            if self._tensors is None:
                raise InvalidArgument("tensor chunk before the header")
            self._tensors.add(part.chunk.tensor_index, part.chunk.data)
        else:
            raise InvalidArgument("request part has neither header nor chunk")

    def _on_header(self, header: engine_pb2.GenerateHeader) -> None:
        if self._header is not None:
            raise InvalidArgument("second header in one Generate stream")
        if len(header.tensors) > MAX_TENSORS:
            raise InvalidArgument(f"{len(header.tensors)} tensors declared; at most {MAX_TENSORS}")
        declared = []
        for i, meta in enumerate(header.tensors):
            what = f"tensors[{i}] ({meta.name})"
            dtype = dtype_from_name(meta.dtype, what)
            if any(d < 0 for d in meta.shape):
                raise InvalidArgument(f"{what}: negative dimension in {list(meta.shape)}")
            declared.append(Declared(what, dtype, tuple(meta.shape)))
        # Sizes are checked against the cap before any buffer is allocated.
        total = sum(d.nbytes for d in declared)
        if total > self._max_bytes:
            raise InvalidArgument(f"declared tensors total {total} bytes; at most {self._max_bytes}")
        self._tensors = TensorAssembly(declared)
        self._header = header

    def finish(self) -> EngineRequest:
        header = self._header
        if header is None or self._tensors is None:
            raise InvalidArgument("Generate stream ended without a header")
        tensors = [NamedTensor(meta.name, t) for meta, t in zip(header.tensors, self._tensors.finish(), strict=True)]
        return EngineRequest(
            request_id=header.request_id,
            token_ids=list(header.token_ids),
            embed_spans=[EmbedSpan(s.offset, s.length, s.tensor_index) for s in header.embed_spans],
            tensors=tensors,
            sampling=SamplingParams.from_pb(header.sampling),
            model_fingerprint=header.model_fingerprint,
            lora=header.lora_name,
        )
