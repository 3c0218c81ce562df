"""The encoder cache: a picture's vision-tower output kept by a hash of the picture's model inputs, so a picture
sent again (a multi-turn chat re-sends every earlier picture) is not encoded again.

Keys are content: a SHA-256 over every tensor of the picture's inputs (pixels and the family's geometry tensors:
grids, sizes, masks), each with its name, dtype and shape; never the placeholder IDs, which are equal for any two
pictures of one size. A request's `cache_salt` keys them too (`salted`), as it keys the prefix cache: tenants with
different salts share no entry, so none can learn from a hit (its time to first token) that another sent a picture.
Entries live within a byte budget, least recently used evicted first.

Every tensor-parallel rank keeps its own cache: each runs the same prompt() calls in the same order, so the
caches make the same hits and evictions and the ranks' vision-tower calls (collectives included) stay in step.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch


def content_key(inputs: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of the tensors' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        t = inputs[name].detach()
        h.update(f"{name}|{t.dtype!s}|{list(t.shape)}|".encode())
        h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def salted(key: str, salt: str | None) -> str:
    """`key` for a request with `salt` (vLLM's cache_salt); unsalted requests share the content key."""
    if salt is None:
        return key
    return hashlib.sha256(b"splice-encoder|" + salt.encode() + b"|salted|" + key.encode()).hexdigest()


class EncoderCache:
    """Feature rows by content key, LRU within `budget` bytes, with the counts of pieces asked for (`queries`) and
    not encoded (`hits`) since the last take_counts()."""

    def __init__(self, budget: int) -> None:
        if budget < 1:
            raise ValueError(f"encoder cache budget must be >= 1 byte, got {budget}")
        self.budget = budget
        self.bytes = 0  # held by the entries now
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> torch.Tensor | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def count(self, queries: int, hits: int) -> None:
        """Records pieces asked for and pieces not encoded (found here, or repeated within one request)."""
        self.queries += queries
        self.hits += hits

    def put(self, key: str, rows: torch.Tensor) -> None:
        """Keeps `rows` (evicting the least recently used entries to make room); an entry over the whole budget
        is not kept."""
        size = rows.numel() * rows.element_size()
        if size > self.budget or key in self._entries:
            return
        while self.bytes + size > self.budget:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()
        self._entries[key] = rows
        self.bytes += size

    def take_counts(self) -> tuple[int, int]:
        """(queries, hits) since the last call, zeroed."""
        counts = (self.queries, self.hits)
        self.queries = self.hits = 0
        return counts
