"""The Upload stream (preprocessor.proto) -> the Chat or Complete request it carries, with the bytes of its
streamed prompt_embeds (and image_embeds) tensors assembled into buffers of their declared sizes (no message size
ceiling).

A streamed tensor is a raw prompt_embeds or image_embeds `tensor` of the request whose data is empty and whose
declared size is not; its bytes follow as TensorChunk messages, counted in request order. Sizes and counts are checked
against the Limits, and the request's declared size against admission (preprocessor/admission.py), before
anything is allocated; the tensors are handed on as views of those buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from preprocessor.content import Where
from preprocessor.limits import Limits
from splice.errors import InvalidArgument
from splice.tensor_assembly import Declared, TensorAssembly
from splice.tensors import byte_view, dtype_from_name
from splice.v1 import common_pb2
from splice.v1 import preprocessor_pb2 as pp

Request = pp.ChatRequest | pp.CompleteRequest


def raw_embeds(request: Request) -> Iterator[tuple[Where, str, common_pb2.Tensor]]:
    """Every raw prompt_embeds or image_embeds tensor of `request`, in request order, with where it is and which."""
    if isinstance(request, pp.ChatRequest):
        for m, msg in enumerate(request.messages):
            for i, part in enumerate(msg.content):
                kind = part.WhichOneof("kind")
                embeds = part.image_embeds.embeds if kind == "image_embeds" else part.prompt_embeds
                if kind in ("prompt_embeds", "image_embeds") and embeds.WhichOneof("encoding") == "tensor":
                    yield Where(m, i), kind, embeds.tensor
    else:
        for i, part in enumerate(request.prompt):
            if part.WhichOneof("kind") == "prompt_embeds" and part.prompt_embeds.WhichOneof("encoding") == "tensor":
                yield Where(None, i), "prompt_embeds", part.prompt_embeds.tensor


class UploadAssembler:
    def __init__(self, limits: Limits, admit: Callable[[int], None] | None = None) -> None:
        """`admit(nbytes)`: called once the request declared its size (its message plus the tensors it streams),
        before the buffers are allocated; it raises to refuse the upload."""
        self._limits = limits
        self._admit = admit
        self.request: Request | None = None
        self._where: list[Where] = []
        self._tensors: TensorAssembly | None = None

    def feed(self, part: pp.UploadPart) -> None:
        kind = part.WhichOneof("part")
        if kind in ("chat", "complete"):
            if self.request is not None:
                raise InvalidArgument("second request in one Upload stream")
            self._on_request(getattr(part, kind))
        elif kind == "chunk":
            if self._tensors is None:
                raise InvalidArgument("tensor chunk before the request in an Upload stream")
            self._tensors.add(part.chunk.tensor_index, part.chunk.data)
        else:
            raise InvalidArgument("upload part has neither a request nor a chunk")

    def _on_request(self, request: Request) -> None:
        declared: list[Declared] = []
        kinds: list[str] = []
        for where, kind, t in raw_embeds(request):
            what = f"{where}: {kind}"
            shape = tuple(t.shape)
            if t.data or not shape or 0 in shape:
                continue  # sent inline (or nothing to stream): decoded as in Chat / Complete
            dtype = dtype_from_name(t.dtype, what)
            if any(d < 0 for d in shape):
                raise InvalidArgument(f"{what} has a negative dimension in {list(shape)}")
            d = Declared(what, dtype, shape)
            if d.nbytes > self._limits.max_embeds_bytes:
                raise InvalidArgument(f"{what} of shape {list(shape)} is {d.nbytes} bytes; at most "
                                      f"{self._limits.max_embeds_bytes}")
            declared.append(d)
            kinds.append(kind)
            self._where.append(where)
        for kind, most in (("prompt_embeds", self._limits.max_embeds_parts), ("image_embeds", self._limits.max_images)):
            if kinds.count(kind) > most:
                raise InvalidArgument(f"the request streams {kinds.count(kind)} {kind} parts; at most {most}")
        if self._admit is not None:
            self._admit(request.ByteSize() + sum(d.nbytes for d in declared))
        self._tensors = TensorAssembly(declared)
        self.request = request

    def finish(self) -> tuple[Request, dict[Where, memoryview]]:
        """The request, and the bytes of each streamed tensor by the part it belongs to."""
        if self.request is None or self._tensors is None:
            raise InvalidArgument("Upload stream ended without a request")
        tensors = self._tensors.finish()
        return self.request, {w: byte_view(t) for w, t in zip(self._where, tensors, strict=True)}
