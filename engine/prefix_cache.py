"""The prefix cache: key/value columns of whole blocks of prompt positions, kept by their content, so that a prompt
beginning with a cached prefix (a shared system prompt, the history of a multi-turn chat) prefills only the rest.

Keys are content, chained: block k's key is a SHA-256 of block k-1's key, the block's token IDs and, for what those
IDs do not say, its extra content:
- a supplied prompt-embeds span overlapping the block: a hash of the block's slice of its rows (and where it lies),
  so the sentinel's filler IDs never key anything alone;
- a picture: its content key (engine/encoder_cache.py: every pixel and geometry tensor) and its offset, in the
  block where its first image position lies; every later block depends on it through the chain. Precomputed image
  features (image_embeds) are one hash of all their rows, at the first image position.
The first block's parent is a root made of the model's fingerprint, the block size and the request's `cache_salt`,
so requests with different salts never share a block. A request that asks for prompt logprobs reads no block
(its positions must be scored), as in vLLM.

Blocks live in one pool per attention layer, [blocks, kv_heads, block_size, head_dim], reserved lazily where the
memory allows (engine/models/slot_cache.py: pages are committed as blocks are written); a block table maps a key to
its pool index; least recently used blocks are evicted first, the tail of a chain before its head. A hit copies the
blocks into the sequence's slot (one gather per layer): the running batch attends over contiguous slot columns, so
a cached prefix is copied once per request instead of gathered at every step of every layer (what transformers'
paged cache does: an index_select of each row's whole context per layer and forward).
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.encoder_cache import content_key
from engine.models.base import ModelFamily
from engine.models.slot_cache import SlotKV, lazy_zeros
from splice.engine_request import IMAGE_EMBEDS, EngineRequest

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16  # vLLM's


@dataclass(frozen=True)
class PrefixKeys:
    """The content keys of a prompt's whole blocks, in order, and after which blocks a hit may end (None: any); with
    what the keys of blocks that go on into its generated tokens need (`extend`): the last key, the prompt's IDs
    after its last whole block and their extra content."""

    keys: list[bytes]
    cuts: list[bool] | None = None
    tail_ids: list[int] = field(default_factory=list)
    tail_extras: list[bytes] = field(default_factory=list)
    root: bytes = b""

    def extend(self, generated: list[int], block_size: int) -> list[bytes]:
        """Keys of the whole blocks after the prompt's, made of its tail and `generated` (tokens whose keys and
        values are cached: a multi-turn chat's next prompt re-sends them as the assistant's turn)."""
        ids = self.tail_ids + generated
        out: list[bytes] = []
        parent = self.keys[-1] if self.keys else self.root
        for k in range(len(ids) // block_size):
            parent = _block_key(parent, ids[k * block_size:(k + 1) * block_size], self.tail_extras if k == 0 else [])
            out.append(parent)
        return out

    def hit_blocks(self, found: int, limit: int) -> int:
        """Of `found` leading blocks in the cache, how many a hit may take (at most `limit`)."""
        n = min(found, limit)
        if self.cuts is not None:
            while n and not self.cuts[n - 1]:
                n -= 1
        return n


def _block_key(parent: bytes, ids: list[int], extras: list[bytes]) -> bytes:
    h = hashlib.sha256(parent)
    h.update(array("q", ids).tobytes())
    for item in extras:
        h.update(hashlib.sha256(item).digest())
    return h.digest()


def _tensor_hash(t: torch.Tensor) -> bytes:
    t = t.detach()
    h = hashlib.sha256(f"{t.dtype!s}|{list(t.shape)}|".encode())
    h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.digest()


def prefix_keys(req: EngineRequest, block_size: int, root: bytes, image_token_id: int | None,
                pieces: list[dict[str, torch.Tensor]], piece_rows: list[int], piece_keys: list[str] | None,
                images_both_ways: bool = False) -> PrefixKeys:
    """Keys of `req`'s whole blocks. `pieces` / `piece_rows` / `piece_keys`: its pictures as the family's vision
    tower encodes them (engine/models/base.py image_pieces), their feature rows and content keys.
    `images_both_ways`: image positions attend each other both ways at prefill (Gemma 3), so a hit must not end
    inside a run of them."""
    ids = req.token_ids
    blocks = len(ids) // block_size
    extras: list[list[bytes]] = [[] for _ in range(blocks + 1)]  # the last: the tail after the whole blocks

    def mix(pos: int, item: bytes) -> None:
        extras[pos // block_size].append((pos % block_size).to_bytes(4, "little") + item)

    spans = sorted(req.embed_spans, key=lambda s: s.offset)
    covered = [False] * len(ids)
    for span in spans:
        rows = req.span_rows(span)
        pos, stop = span.offset, span.offset + span.length
        while pos < stop:  # one hash per block the span overlaps, of that block's rows
            end = min(stop, (pos // block_size + 1) * block_size)
            mix(pos, b"embeds" + _tensor_hash(rows[pos - span.offset:end - span.offset]))
            pos = end
        for p in range(span.offset, span.offset + span.length):
            covered[p] = True
    image_pos = [i for i, t in enumerate(ids) if t == image_token_id and not covered[i]] if image_token_id is not None \
        else []
    inputs = req.model_inputs
    if image_pos and inputs:
        if IMAGE_EMBEDS in inputs:
            mix(image_pos[0], b"image_embeds" + _tensor_hash(inputs[IMAGE_EMBEDS]))
        elif pieces and sum(piece_rows) == len(image_pos):
            keys = piece_keys if piece_keys is not None and len(piece_keys) == len(pieces) \
                else [content_key(p) for p in pieces]
            at = 0
            for key, rows in zip(keys, piece_rows, strict=True):
                mix(image_pos[at], b"picture" + bytes.fromhex(key))
                at += rows
        else:  # rows not attributable to pieces: every picture keys the first image position (and all after it)
            mix(image_pos[0], b"pictures" + _tensor_hash(torch.cat([t.reshape(-1).float() for t in inputs.values()])))
    keys: list[bytes] = []
    parent = root
    for k in range(blocks):
        parent = _block_key(parent, ids[k * block_size:(k + 1) * block_size], extras[k])
        keys.append(parent)
    cuts = None
    if images_both_ways and image_pos:
        is_image = set(image_pos)
        cuts = [not ((k + 1) * block_size - 1 in is_image and (k + 1) * block_size in is_image) for k in range(blocks)]
    return PrefixKeys(keys, cuts, list(ids[blocks * block_size:]), extras[blocks], root)


def request_keys(req: EngineRequest, family: ModelFamily, fingerprint: str, block_size: int) -> PrefixKeys:
    """The keys of `req`'s whole blocks, its pictures as `family`'s vision tower encodes them."""
    inputs = req.model_inputs
    pieces = family.image_pieces(inputs) if inputs and IMAGE_EMBEDS not in inputs else []
    rows = [family.images.expected_rows(p) for p in pieces]
    root = cache_root(fingerprint, block_size, req.sampling.cache_salt)
    return prefix_keys(req, block_size, root, family.image_token_id, pieces, rows, req.image_keys,
                       family.images_both_ways)


def cache_root(fingerprint: str, block_size: int, salt: str | None) -> bytes:
    """The parent of a request's first block: the model, the block size and the request's cache_salt."""
    return hashlib.sha256(f"splice-prefix|{fingerprint}|{block_size}|".encode() + (salt or "").encode()
                          + (b"|salted" if salt else b"")).digest()


def for_engine(cfg: EngineConfig, family: ModelFamily) -> PrefixCache | None:
    """The prefix cache, where it is on and can serve this model; one log line says why not otherwise."""
    if not cfg.enable_prefix_caching or not cfg.prefix_cache_mb:
        return None
    if cfg.tensor_parallel_size > 1:
        log.info("prefix caching is off: not implemented for tensor parallelism (--tensor-parallel-size %d)",
                 cfg.tensor_parallel_size)
        return None
    if not family.cache.chunkable:
        log.info("prefix caching is off for the %s family: its recurrent layers' state is not kept at block "
                 "boundaries (the encoder cache still applies)", family.name)
        return None
    log.info("prefix caching on: blocks of %d positions within %d MiB", cfg.block_size, cfg.prefix_cache_mb)
    if cfg.simulate_forward_ms is not None:
        log.info("prefix caching under --simulate-forward-ms: keys are made, but a simulated forward writes no "
                 "key/value columns, so no block is kept and no prompt hits")
    return PrefixCache(cfg.block_size, cfg.prefix_cache_mb << 20)


class PrefixCache:
    """The block pools and the block table (engine thread only). Budget in bytes across every layer's pool."""

    def __init__(self, block_size: int, budget: int) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.budget = budget
        self.capacity = 0  # blocks the pools hold; known at the first store (from the layers' shapes)
        self._k: dict[int, torch.Tensor] = {}  # layer -> [capacity, kv_heads, block_size, head_dim]
        self._v: dict[int, torch.Tensor] = {}
        self._table: OrderedDict[bytes, int] = OrderedDict()  # key -> pool index, least recently used first
        self._free: list[int] = []  # pool indexes not holding a block, lowest last (taken first: pages stay cold)
        # blocks a restore of the current step will read: never evicted by the blocks other prompts keep before it
        self.pinned: set[bytes] = set()

    @property
    def blocks(self) -> int:
        """Blocks held now."""
        return len(self._table)

    def match(self, keys: PrefixKeys, limit: int) -> int:
        """Leading blocks of `keys` a hit may take now, at most `limit` (reads nothing, changes nothing)."""
        found = 0
        for key in keys.keys[:limit]:
            if key not in self._table:
                break
            found += 1
        return keys.hit_blocks(found, limit)

    def hit(self, keys: PrefixKeys | None, prompt_len: int) -> int:
        """Positions of a prompt of `prompt_len` positions with `keys` the cache holds now: whole blocks, its last
        position never (its logits are needed)."""
        if keys is None:
            return 0
        return self.match(keys, (prompt_len - 1) // self.block_size) * self.block_size

    def reset(self) -> None:
        """Forgets every block (the pools stay reserved)."""
        self._table.clear()
        self._free = list(range(self.capacity - 1, -1, -1))

    @torch.inference_mode()
    def restore(self, keys: list[bytes], kv: SlotKV, slot: int, reserve: int) -> None:
        """The blocks of `keys` (all held: `match` said so this step) into columns [0, len(keys) * block_size) of
        `slot`, whose buffers are made to hold `reserve` columns; they become the most recently used."""
        index = torch.tensor([self._table[k] for k in keys])
        for k in reversed(keys):  # the head of the chain used last: evicted after its tail
            self._table.move_to_end(k)
        for layer, pool in self._k.items():
            kv.write_columns(layer, slot, self._columns(pool, index), self._columns(self._v[layer], index), reserve)

    def _columns(self, pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Pool blocks `index` as columns [kv_heads, len(index) * block_size, head_dim]."""
        got = pool[index.to(pool.device)]  # [n, kv_heads, block_size, head_dim]
        return got.transpose(0, 1).reshape(got.shape[1], -1, got.shape[3])

    def keep(self, keys: list[bytes], kv: SlotKV, slot: int, start: int) -> None:
        """`store`, where a failure costs later hits only (logged, not raised)."""
        try:
            self.store(keys, kv, slot, start)
        except Exception:
            log.exception("keeping blocks in the prefix cache failed")

    def keep_generated(self, kv: SlotKV, slot: int, prompt: PrefixKeys, generated: list[int]) -> None:
        """The whole blocks of `generated` tokens of the row in `slot` after its prompt (of keys `prompt`), as far as
        its columns are written: a multi-turn chat's next prompt re-sends them."""
        keys = prompt.extend(generated, self.block_size)
        if slot >= kv.rows or not keys:
            return
        size, first = self.block_size, len(prompt.keys)
        start = kv.start[slot]
        whole = (kv.end[slot] - start) // size - first  # blocks of it whose every column is written
        if whole > 0:
            self.keep(keys[:whole], kv, slot, start + first * size)

    @torch.inference_mode()
    def store(self, keys: list[bytes], kv: SlotKV, slot: int, start: int) -> None:
        """Keeps the blocks of `keys` not held yet, from `slot`'s columns (block k at start + k * block_size),
        evicting the least recently used to make room; held ones become the most recently used. A chain continued
        (a sequence's generated blocks) gives its keys from where it goes on, and `start` where their columns do."""
        if not kv.layers:
            return
        if not self._k:
            self._reserve(kv)
        for key in reversed(keys):  # the held ones first: they are not what makes room for the others
            if key in self._table:
                self._table.move_to_end(key)
        new = [k for k, key in enumerate(keys) if key not in self._table]
        if len(new) > len(self._free):  # room from the least recently used blocks no restore of this step needs
            victims = [key for key in self._table if key not in self.pinned][:len(new) - len(self._free)]
            self._free += [self._table.pop(key) for key in victims]
            new = new[:len(self._free)]
        if not new:
            return
        index = [self._free.pop() for _ in new]
        try:
            self._copy_in(kv, slot, start, new, index)
        except BaseException:
            self._free += index  # nothing of them is kept: the table never names a block it does not hold
            raise
        for k, at in zip(new, index, strict=True):
            self._table[keys[k]] = at
        for key in reversed(keys):
            if key in self._table:
                self._table.move_to_end(key)

    def _copy_in(self, kv: SlotKV, slot: int, start: int, blocks: list[int], index: list[int]) -> None:
        """Blocks `blocks` of `slot` (block k at column start + k * block_size) into pool entries `index`."""
        bs = self.block_size
        cols = torch.tensor([start + k * bs + j for k in blocks for j in range(bs)])
        pool_index = torch.tensor(index)
        for layer, buffers in kv.layers.items():
            if layer not in self._k:
                continue
            for pool, buf in ((self._k[layer], buffers.k_buf), (self._v[layer], buffers.v_buf)):
                got = buf[slot][:, cols.to(buf.device)]  # [kv_heads, n * bs, head_dim]
                pool[pool_index.to(pool.device)] = got.reshape(got.shape[0], len(blocks), bs, -1).transpose(0, 1)

    def _reserve(self, kv: SlotKV) -> None:
        """Pools for the layers that hold keys, as many blocks as the budget pays for."""
        shapes = {i: layer.k_buf for i, layer in kv.layers.items() if layer.k_buf is not None}
        per_block = sum(2 * b.shape[1] * self.block_size * b.shape[3] * b.element_size() for b in shapes.values())
        self.capacity = self.budget // per_block if per_block else 0
        for i, b in shapes.items():
            shape = [self.capacity, b.shape[1], self.block_size, b.shape[3]]
            self._k[i] = pool if (pool := lazy_zeros(shape, b)) is not None else b.new_zeros(shape)
            self._v[i] = pool if (pool := lazy_zeros(shape, b)) is not None else b.new_zeros(shape)
        self._free = list(range(self.capacity - 1, -1, -1))
