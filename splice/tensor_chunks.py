"""Tensors out as bounded TensorChunk messages (the engine's Generate stream, the preprocessor's Upload);
splice.tensor_assembly is the receiving side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TypeVar

import torch

from splice.tensors import byte_view
from splice.v1 import common_pb2

# Well below gRPC's default 4 MiB message limit, so no message needs a raised limit.
CHUNK_BYTES = 1 << 20
T = TypeVar("T")


def tensor_chunks(tensors: Iterable[torch.Tensor], chunk_bytes: int | None = None) -> Iterator[common_pb2.TensorChunk]:
    """Every tensor's bytes, tensors in order, built lazily from a view of each tensor's storage: the slice
    copied into each chunk is the only copy made here. `chunk_bytes`: CHUNK_BYTES unless given."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    for index, t in enumerate(tensors):
        data = byte_view(t)
        for start in range(0, len(data), chunk_bytes):
            yield common_pb2.TensorChunk(tensor_index=index, data=bytes(data[start:start + chunk_bytes]))


async def paced(parts: Iterator[T]) -> AsyncIterator[T]:
    """Each part built when gRPC asks for it (one bounded chunk at a time, under flow control), so a large
    tensor is never held twice; yielding to the loop between parts keeps other streams going."""
    for part in parts:
        yield part
        await asyncio.sleep(0)
