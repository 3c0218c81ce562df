"""EngineRequest <-> the Generate client stream (a header, then bounded tensor chunks).

Structural checks live here (header first, declared sizes, chunk order, byte counts); what the IDs and
spans mean is checked by the engine's validator.
"""

from __future__ import annotations

from collections.abc import Iterator

from splice.engine_request import EmbedSpan, EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from splice.tensors import dtype_from_name, dtype_name, from_bytes, nbytes_of, to_bytes
from splice.v1 import common_pb2, engine_pb2

# Well below gRPC's default 4 MiB message limit, so no message needs a raised limit.
CHUNK_BYTES = 1 << 20
MAX_TENSORS = 64
MAX_REQUEST_BYTES = 1 << 30


def encode_request(req: EngineRequest, chunk_bytes: int = CHUNK_BYTES) -> Iterator[engine_pb2.GenerateRequestPart]:
    header = engine_pb2.GenerateHeader(
        request_id=req.request_id,
        token_ids=req.token_ids,
        embed_spans=[common_pb2.EmbedSpan(offset=s.offset, length=s.length, tensor_index=s.tensor_index)
                     for s in req.embed_spans],
        tensors=[engine_pb2.TensorMeta(name=t.name, dtype=dtype_name(t.tensor.dtype), shape=list(t.tensor.shape))
                 for t in req.tensors],
        sampling=req.sampling.to_pb(),
    )
    yield engine_pb2.GenerateRequestPart(header=header)
    for index, named in enumerate(req.tensors):
        data = to_bytes(named.tensor)
        for start in range(0, len(data), chunk_bytes):
            chunk = engine_pb2.TensorChunk(tensor_index=index, data=data[start:start + chunk_bytes])
            yield engine_pb2.GenerateRequestPart(chunk=chunk)


class RequestAssembler:
    """Feeds on GenerateRequestPart messages; `finish()` returns the EngineRequest."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self._max_bytes = max_request_bytes
        self._header: engine_pb2.GenerateHeader | None = None
        self._expected: list[int] = []
        self._buffers: list[bytearray] = []
        self._current = 0

    @property
    def declared_bytes(self) -> int:
        """Total tensor bytes the header announced (0 before the header)."""
        return sum(self._expected)

    def feed(self, part: engine_pb2.GenerateRequestPart) -> None:
        kind = part.WhichOneof("part")
        if kind == "header":
            self._on_header(part.header)
        elif kind == "chunk":
            self._on_chunk(part.chunk)
        else:
            raise InvalidArgument("request part has neither header nor chunk")

    def _on_header(self, header: engine_pb2.GenerateHeader) -> None:
        if self._header is not None:
            raise InvalidArgument("second header in one Generate stream")
        if len(header.tensors) > MAX_TENSORS:
            raise InvalidArgument(f"{len(header.tensors)} tensors declared; at most {MAX_TENSORS}")
        total = 0
        for i, meta in enumerate(header.tensors):
            dtype = dtype_from_name(meta.dtype, f"tensors[{i}] ({meta.name})")
            if any(d < 0 for d in meta.shape):
                raise InvalidArgument(f"tensors[{i}] ({meta.name}): negative dimension in {list(meta.shape)}")
            size = nbytes_of(dtype, list(meta.shape))
            total += size
            self._expected.append(size)
        # Sizes are checked against the cap before any buffer is allocated.
        if total > self._max_bytes:
            raise InvalidArgument(f"declared tensors total {total} bytes; at most {self._max_bytes}")
        self._buffers = [bytearray() for _ in header.tensors]
        self._header = header

    def _on_chunk(self, chunk: engine_pb2.TensorChunk) -> None:
        if self._header is None:
            raise InvalidArgument("tensor chunk before the header")
        i = chunk.tensor_index
        if i >= len(self._buffers):
            raise InvalidArgument(f"chunk for tensors[{i}], but only {len(self._buffers)} declared")
        if i < self._current:
            raise InvalidArgument(f"chunk for tensors[{i}] after tensors[{self._current}] began")
        for skipped in range(self._current, i):
            self._check_complete(skipped)
        self._current = i
        if len(self._buffers[i]) + len(chunk.data) > self._expected[i]:
            raise InvalidArgument(f"tensors[{i}]: more bytes than its declared {self._expected[i]}")
        self._buffers[i] += chunk.data

    def _check_complete(self, i: int) -> None:
        got, want = len(self._buffers[i]), self._expected[i]
        if got != want:
            name = self._header.tensors[i].name if self._header else "?"
            raise InvalidArgument(f"tensors[{i}] ({name}): received {got} bytes, declared {want}")

    def finish(self) -> EngineRequest:
        header = self._header
        if header is None:
            raise InvalidArgument("Generate stream ended without a header")
        for i in range(len(self._buffers)):
            self._check_complete(i)
        tensors = [
            NamedTensor(meta.name, from_bytes(buf, dtype_from_name(meta.dtype), list(meta.shape),
                                              f"tensors[{i}] ({meta.name})"))
            for i, (meta, buf) in enumerate(zip(header.tensors, self._buffers, strict=True))
        ]
        self._buffers = []
        return EngineRequest(
            request_id=header.request_id,
            token_ids=list(header.token_ids),
            embed_spans=[EmbedSpan(s.offset, s.length, s.tensor_index) for s in header.embed_spans],
            tensors=tensors,
            sampling=SamplingParams.from_pb(header.sampling),
        )
