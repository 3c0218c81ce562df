"""Declared tensors whose bytes arrive as ordered chunks (the engine's Generate stream, the preprocessor's
Upload): each is written into a buffer of its declared size, allocated once, and handed out as a view of it.

The sizes come from dtype x shape; the caller checks them against its caps before constructing this.
Chunks of a tensor arrive in order and tensors in order; nothing is copied after the chunk is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splice.errors import InvalidArgument
from splice.tensors import nbytes_of


@dataclass(frozen=True)
class Declared:
    what: str  # how errors name the tensor ("tensors[2] (pixel_values)", "prompt[1]: prompt_embeds", ...)
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.dtype, self.shape)


class TensorAssembly:
    def __init__(self, declared: list[Declared]) -> None:
        self.declared = declared
        self._tensors = [torch.empty(d.shape, dtype=d.dtype) for d in declared]
        # flat byte views of the same storage: chunks are written through these
        self._bytes = [t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
                       for t in self._tensors]
        self._filled = [0] * len(declared)
        self._current = 0
        self._missing = sum(d.nbytes for d in declared)  # declared bytes not arrived yet

    @property
    def complete(self) -> bool:
        """Every declared byte has arrived (true at once when nothing, or only empty tensors, was declared)."""
        return self._missing == 0

    def add(self, index: int, data: bytes) -> None:
        """The next bytes of declared tensor `index`."""
        if index >= len(self.declared):
            raise InvalidArgument(f"chunk for tensor {index}, but only {len(self.declared)} declared")
        if index < self._current:
            raise InvalidArgument(f"chunk for {self.declared[index].what} after {self.declared[self._current].what} "
                                  f"began")
        for skipped in range(self._current, index):
            self._check_complete(skipped)
        self._current = index
        start, end = self._filled[index], self._filled[index] + len(data)
        if end > self.declared[index].nbytes:
            raise InvalidArgument(f"{self.declared[index].what}: more bytes than its declared "
                                  f"{self.declared[index].nbytes}")
        self._bytes[index][start:end] = np.frombuffer(data, dtype=np.uint8)
        self._filled[index] = end
        self._missing -= len(data)

    def _check_complete(self, i: int) -> None:
        got, want = self._filled[i], self.declared[i].nbytes
        if got != want:
            raise InvalidArgument(f"{self.declared[i].what}: received {got} bytes, declared {want}")

    def finish(self) -> list[torch.Tensor]:
        """Every declared tensor, complete, as [shape] views of the buffers the chunks were written into."""
        for i in range(len(self.declared)):
            self._check_complete(i)
        out, self._tensors, self._bytes = self._tensors, [], []
        return out
