"""Key/value storage whose rows stay where they are while other rows join and leave (one slot per sequence).

Every attention layer owns two preallocated buffers [slots, kv_heads, columns, head_dim]. The engine gives the
capacity its running batch can reach (its most running sequences, the longest sequence): on the CPU the buffers are
reserved at that size at once, in anonymous memory that the OS commits only where a key is written (so a 64-slot
reservation of the whole context costs the memory of what is cached, not of the reservation), and they never move.
Without a capacity (or on a GPU) they grow by doubling (amortized, never a torch.cat per step; columns in powers of
two, and for a long prompt's whole length and its first decoded token at its first part, so that a prompt prefilled
over several steps makes the buffers grow once): a growth copies every written slot and stalls that step, which is
why the reservation exists. A sequence lives
in one slot: its real keys are the columns [start, end) of that slot (start > 0 when it was left-padded in a group
prefill), and its next token is written at column `end`. Keys are cached after RoPE, so the columns of different rows
need not line up: the attention mask says which columns of each row are real, and is omitted when every row spans the
same columns.

- A forward is planned first (`plan_prefill` / `plan_decode`): which slots it covers, where each row writes, how
  many columns attention reads. Each layer's `update` writes there and returns views of the buffers.
- New rows go to the next free slots; a leaving row's slot is filled by moving the last row into it (that one row's
  columns copied, nothing else moves) and the slot count shrinks.
- A mixed step may run as one packed forward (`plan_packed`): its tokens are one row [1, N], one decode token per row
  in use and then the prompt positions of some sequences (`Segment`s); `update` writes each token's key where its
  sequence goes and the attention function (engine/models/attention.py) splits the queries by `Packed`.
"""

from __future__ import annotations

import mmap
import sys
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


@dataclass(frozen=True)
class Segment:
    """Prompt positions [past, past + length) of the sequence in `slot`, in a packed forward: they attend that slot's
    columns before them and each other causally."""

    slot: int
    past: int
    length: int


@dataclass
class Packed:
    """How a packed forward's N tokens split: first one decode token for each of the `rows` rows in use (written at
    that row's end), then the segments' prompt positions in order."""

    rows: int
    cols: torch.Tensor | None  # [rows] long, the column each row writes; None when all write at `col`
    col: int
    decode_width: int  # columns the decode queries read: the widest row's end + 1
    decode_mask: torch.Tensor | None  # [rows, 1, 1, decode_width] bool (True = attend); None when all are real
    segments: list[Segment]
    segment_masks: list[torch.Tensor | None]  # [1, 1, length, past + length] bool; None = plainly causal (past 0)


@dataclass
class Plan:
    """Where the next forward writes: slots [first, first + count), the q new columns of each row starting at `col`
    (or at cols[i] per row, decode only), attention reading columns [0, width)."""

    first: int = 0
    count: int = 0
    col: int = 0
    cols: torch.Tensor | None = None  # [count] long, when rows write at different columns
    width: int = 0
    q: int = 0
    packed: Packed | None = None  # a packed forward's split (then `count` slots from 0 and `width` bound the writes)
    reserve: int = 0  # columns the buffers should hold after this forward, if more than `width`

    @property
    def past(self) -> int:
        """Columns before the new ones (what transformers reads as the cache's sequence length)."""
        return self.width - self.q


class SlotKV:
    """The slot table and the per-layer buffers of one running batch."""

    def __init__(self, capacity: tuple[int, int] | None = None) -> None:
        self.capacity = capacity  # (slots, columns) the buffers are reserved at up front, where memory allows
        self.start: list[int] = []  # per slot in use: first real column
        self.end: list[int] = []  # per slot in use: next free column (one past the last real one)
        self.plan = Plan()
        self.layers: dict[int, SlotLayer] = {}  # layer index -> its buffers (attention layers that wrote)

    @property
    def rows(self) -> int:
        return len(self.end)

    @property
    def width(self) -> int:
        """Columns the rows in use span: max end."""
        return max(self.end, default=0)

    def layer(self, idx: int) -> SlotLayer:
        if idx not in self.layers:
            self.layers[idx] = SlotLayer(self)
        return self.layers[idx]

    # --- planning (the runner, before each forward) --------------------------------------------------

    def plan_prefill(self, count: int, q: int, past: int = 0, first: int | None = None) -> None:
        """`count` rows of q new columns at columns [past, past + q): new slots after the rows in use, or the slots
        from `first` (a long prompt continued chunk by chunk)."""
        first = self.rows if first is None else first
        self.plan = Plan(first, count, past, None, past + q, q)

    def plan_decode(self, rows: int | None = None) -> None:
        """One new column for each of the first `rows` rows (default: every row in use), each at its own end."""
        rows = self.rows if rows is None else rows
        ends = self.end[:rows]
        col = ends[0] if len(set(ends)) == 1 else None
        cols = None if col is not None else torch.tensor(ends)
        self.plan = Plan(0, rows, col or 0, cols, max(ends) + 1, 1)

    def plan_packed(self, segments: list[Segment], device: torch.device | None = None, reserve: int = 0,
                    rows: int | None = None) -> None:
        """A packed forward: one new column for each of the first `rows` rows (default: every row in use), each at
        its own end, then `segments` (`reserve`: a long prompt's whole length, as in Plan)."""
        rows = self.rows if rows is None else rows
        ends = self.end[:rows]
        same = len(set(ends)) <= 1
        cols = None if same else torch.tensor(ends, device=device)
        decode_width = max(ends) + 1 if rows else 0
        decode_mask = None
        if rows and not (same and not any(self.start[:rows])):  # some row's columns are not all real
            decode_mask = self.key_mask(1, rows).bool()[:, None, None].to(device)
        masks: list[torch.Tensor | None] = []
        for s in segments:
            key = torch.arange(s.past + s.length, device=device)
            query = s.past + torch.arange(s.length, device=device)
            masks.append((key[None, :] <= query[:, None])[None, None] if s.past else None)
        packed = Packed(rows, cols, ends[0] if same and rows else 0, decode_width, decode_mask, list(segments),
                        masks)
        slots = max([self.rows, *(s.slot + 1 for s in segments)])
        width = max([decode_width, *(s.past + s.length for s in segments)])
        self.plan = Plan(0, slots, 0, None, width, rows + sum(s.length for s in segments), packed, reserve)

    def key_mask(self, q: int, rows: int | None = None) -> torch.Tensor:
        """[rows, width + q] long: 1 at each row's real columns and its q new ones (the decode step's mask), for the
        first `rows` rows (default: every row in use; `width` is theirs)."""
        rows = self.rows if rows is None else rows
        start, end = torch.tensor(self.start[:rows]), torch.tensor(self.end[:rows])
        col = torch.arange(max(self.end[:rows], default=0) + q)
        return ((col[None] >= start[:, None]) & (col[None] < end[:, None] + q)).long()

    # --- rows ----------------------------------------------------------------------------------------

    def add_rows(self, starts: list[int], ends: list[int]) -> None:
        """Records the rows a planned prefill wrote in new slots."""
        self.start += starts
        self.end += ends

    def advance(self, q: int = 1, rows: int | None = None) -> None:
        """The first `rows` rows (default: all) are q columns longer."""
        rows = self.rows if rows is None else rows
        self.end[:rows] = [e + q for e in self.end[:rows]]

    def swap(self, a: int, b: int) -> None:
        """Rows `a` and `b` trade slots (their columns, in every layer): the rows a step decodes are the first ones."""
        for layer in self.layers.values():
            layer.swap_rows(a, b, self.end[a], self.end[b])
        self.start[a], self.start[b] = self.start[b], self.start[a]
        self.end[a], self.end[b] = self.end[b], self.end[a]

    def move(self, src: int, dst: int) -> None:
        """Slot `src`'s row into slot `dst` (only its columns are copied)."""
        self.copy_columns(src, dst, self.end[src])
        self.start[dst], self.end[dst] = self.start[src], self.end[src]

    def fork(self, src: int) -> int:
        """A new slot after the rows in use holding a copy of slot `src`'s row (its columns, in every layer): one of
        the other choices of an n > 1 request, which continue from its prompt on their own. Returns the new slot."""
        dst = self.rows
        self.copy_columns(src, dst, self.end[src])
        self.add_rows([self.start[src]], [self.end[src]])
        return dst

    def copy_columns(self, src: int, dst: int, width: int) -> None:
        """Columns [0, width) of slot `src` into slot `dst`, in every layer (a row not in the table yet, too)."""
        for layer in self.layers.values():
            layer.copy_row(src, dst, width)

    def write_columns(self, idx: int, slot: int, keys: torch.Tensor, values: torch.Tensor, reserve: int) -> None:
        """keys/values [kv_heads, n, head_dim] into columns [0, n) of `slot` in layer `idx` (a cached prefix, before
        the row is in the table), its buffers made to hold `reserve` columns."""
        layer = self.layer(idx)
        n = keys.shape[1]
        layer._reserve(keys[None], slot + 1, max(n, reserve))
        layer.written = (max(layer.written[0], slot + 1), max(layer.written[1], n))
        layer.k_buf[slot, :, :n] = keys
        layer.v_buf[slot, :, :n] = values

    def truncate(self, rows: int) -> None:
        """Frees the slots from `rows` on."""
        del self.start[rows:], self.end[rows:]

    def free(self) -> None:
        """Drops every layer's buffers now: a layer and its SlotKV refer to each other, so without this they (and
        their reserved pages) would wait for the cyclic garbage collector, which an idle process never runs."""
        for layer in self.layers.values():
            layer.k_buf = layer.v_buf = layer.keys = layer.values = None
        self.layers = {}

    def refresh(self) -> None:
        """Points every layer's `keys` / `values` at the rows and columns in use (views, no copy)."""
        for layer in self.layers.values():
            layer.show(self.rows, self.width)


def power_of_two(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << max(n - 1, 0).bit_length()


MAP_NORESERVE = 0x4000  # Linux: no swap is reserved for the mapping, so its size is not held against overcommit


def lazy_zeros(shape: list[int], like: torch.Tensor) -> torch.Tensor | None:
    """A zero tensor of `shape` whose pages are committed only when written (anonymous memory: the kernel hands out
    zero pages on first touch), for a CPU tensor on Linux; None where that is not available (the caller allocates)."""
    if like.device.type != "cpu" or not sys.platform.startswith("linux"):
        return None
    size = like.element_size()
    for n in shape:
        size *= n
    try:
        buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    except (OSError, OverflowError, ValueError):
        return None
    return torch.frombuffer(buf, dtype=like.dtype, count=size // like.element_size()).view(shape)  # keeps buf alive


class SlotLayer(DynamicLayer):
    """One attention layer's buffers; `update` writes where the plan says and returns the columns to attend."""

    def __init__(self, kv: SlotKV) -> None:
        super().__init__()
        self.kv = kv
        self.k_buf: torch.Tensor | None = None  # [slot capacity, kv_heads, column capacity, head_dim]
        self.v_buf: torch.Tensor | None = None
        self.written = (0, 0)  # (slots, columns) that may hold keys: what a growth must copy

    def _reserve(self, like: torch.Tensor, slots: int, width: int) -> None:
        """Buffers holding `slots` slots and `width` columns: the SlotKV's capacity at once where it can be reserved
        lazily, else doubled (and the written part copied) when too small."""
        if self.k_buf is not None and slots <= self.k_buf.shape[0] and width <= self.k_buf.shape[2]:
            return
        old_k, old_v = self.k_buf, self.v_buf
        if old_k is None:
            shape = [slots, like.shape[1], power_of_two(width), like.shape[3]]
        else:
            n, cap = old_k.shape[0], old_k.shape[2]
            shape = [n if slots <= n else max(slots, 2 * n), like.shape[1],
                     cap if width <= cap else power_of_two(max(width, 2 * cap)), like.shape[3]]
        k = v = None
        if self.kv.capacity is not None:
            wide = [max(shape[0], self.kv.capacity[0]), shape[1], max(shape[2], self.kv.capacity[1]), shape[3]]
            k, v = lazy_zeros(wide, like), lazy_zeros(wide, like)
        if k is None or v is None:
            k, v = like.new_zeros(shape), like.new_zeros(shape)
        self.k_buf, self.v_buf = k, v
        if old_k is not None:
            n, cols = self.written
            self.k_buf[:n, :, :cols] = old_k[:n, :, :cols]
            self.v_buf[:n, :, :cols] = old_v[:n, :, :cols]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value_states [count, kv_heads, q, head_dim] -> views [count, kv_heads, width, head_dim]."""
        p = self.kv.plan
        last = p.first + p.count
        self._reserve(key_states, last, max(p.width, p.reserve))
        self.written = (max(self.written[0], last), max(self.written[1], p.width))
        if p.packed is not None:
            self._write_packed(key_states[0], value_states[0], p.packed)
        elif p.cols is None:
            q = key_states.shape[2]
            self.k_buf[p.first:last, :, p.col:p.col + q] = key_states
            self.v_buf[p.first:last, :, p.col:p.col + q] = value_states
        else:  # one column per row, each at its own place
            rows = torch.arange(p.first, last, device=key_states.device)
            self.k_buf[rows, :, p.cols] = key_states[:, :, 0]
            self.v_buf[rows, :, p.cols] = value_states[:, :, 0]
        self.keys = self.k_buf[p.first:last, :, :p.width]
        self.values = self.v_buf[p.first:last, :, :p.width]
        return self.keys, self.values

    def _write_packed(self, keys: torch.Tensor, values: torch.Tensor, packed: Packed) -> None:
        """keys/values [kv_heads, N, head_dim] of a packed forward, each token where its sequence goes."""
        n = packed.rows
        if n:
            if packed.cols is None:
                self.k_buf[:n, :, packed.col] = keys[:, :n].transpose(0, 1)  # [rows, kv_heads, head_dim]
                self.v_buf[:n, :, packed.col] = values[:, :n].transpose(0, 1)
            else:
                rows = torch.arange(n, device=keys.device)
                self.k_buf[rows, :, packed.cols] = keys[:, :n].transpose(0, 1)
                self.v_buf[rows, :, packed.cols] = values[:, :n].transpose(0, 1)
        at = n
        for s in packed.segments:
            self.k_buf[s.slot, :, s.past:s.past + s.length] = keys[:, at:at + s.length]
            self.v_buf[s.slot, :, s.past:s.past + s.length] = values[:, at:at + s.length]
            at += s.length

    def copy_row(self, src: int, dst: int, width: int) -> None:
        if self.k_buf is not None:
            self._reserve(self.k_buf, dst + 1, width)  # (a fork's new slot may lie past buffers grown as needed)
            self.written = (max(self.written[0], dst + 1), max(self.written[1], width))
            self.k_buf[dst, :, :width] = self.k_buf[src, :, :width]
            self.v_buf[dst, :, :width] = self.v_buf[src, :, :width]

    def swap_rows(self, a: int, b: int, width_a: int, width_b: int) -> None:
        if self.k_buf is not None:
            for buf in (self.k_buf, self.v_buf):
                row_a = buf[a, :, :width_a].clone()
                buf[a, :, :width_b] = buf[b, :, :width_b]
                buf[b, :, :width_a] = row_a

    def show(self, rows: int, width: int) -> None:
        if self.k_buf is not None:
            self.keys = self.k_buf[:rows, :, :width]
            self.values = self.v_buf[:rows, :, :width]

    def get_seq_length(self) -> int:
        return self.kv.plan.past

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.kv.plan.past + query_length, 0


class SlotCache(Cache):
    """The cache a forward sees for a family whose every cached layer is a key/value layer: layer i is the
    SlotKV's layer i, created when that layer first writes (layers that reuse another's keys never do)."""

    def __init__(self, kv: SlotKV) -> None:
        super().__init__(layers=[])
        self.kv = kv

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer_idx:
            self.layers.append(self.kv.layer(len(self.layers)))
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class SlotKVCache:
    """Row operations of a family whose cache is key/value layers only: nothing beyond the SlotKV's own."""

    chunkable = True  # a long prompt may be prefilled chunk by chunk, each chunk attending to the columns before it

    def new(self, kv: SlotKV) -> Cache:
        return SlotCache(kv)

    def for_prefill(self, kv: SlotKV, running: Cache | None) -> Cache:
        """The cache a prefill of new rows runs on: the running one (new rows only touch new slots)."""
        return running if running is not None else self.new(kv)

    def join(self, running: Cache | None, prefilled: Cache) -> Cache:
        return prefilled

    def move(self, cache: Cache, src: int, dst: int) -> None:
        pass

    def fork(self, cache: Cache, src: int, copies: int) -> None:
        """Nothing beyond the SlotKV's own copies (SlotKV.fork)."""

    def swap(self, cache: Cache, a: int, b: int) -> None:
        """Nothing beyond the SlotKV's own (SlotKV.swap)."""

    def narrow(self, cache: Cache, rows: int) -> Any:
        """Before a forward of the first `rows` rows only: the slot layers read the plan's rows already."""
        return None

    def widen(self, cache: Cache, aside: Any) -> None:
        """After it (`aside`: what `narrow` returned)."""

    def truncate(self, cache: Cache, rows: int) -> None:
        pass
