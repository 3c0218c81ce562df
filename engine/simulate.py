"""A simulated forward (`splice engine --simulate-forward-ms MS`): a benchmarking aid that measures the stack's own
overhead at GPU speed on any machine.

On a GPU a small model's forward at batch 256 takes ~10 ms, during which the engine process's CPU is free; on a CPU
the forward takes the cores that the scheduler, the sampler, both gRPC hops and the detokenizer need. Here the model's
calls are replaced, everything else stays real: the family (engine/models/) is subclassed so that its text stack
(`backbone`), `logits`, `lookup` and vision tower (`image_features`) become:

- a forward that takes (no CPU held, the GIL released) MS ms when it decodes rows, plus MS ms per started
  PROMPT_POSITIONS_PER_FORWARD of the prompt positions it prefills;
- a vision tower call that takes MS ms and gives zero features of the family's own row count.

As on a GPU, where a forward's kernels are launched at once and the host waits only when it reads their results, a
call returns at once and its time runs from then: `synchronize()` (the engine calls it before it samples, where a
GPU's results are first read) sleeps until every call made so far would have finished. So the host work between a
launch and that read (handing the previous step's outputs over) overlaps the forward, as it does on a GPU; the
results themselves are computed at once (they are cheap), only their time is simulated. The calls so simulated:
- logits of the full vocabulary width in which one token, `simulated_next` of the position's token and its position
  id, stands LEAD above the rest: every sampler (greedy or not, penalties) picks it, so outputs are deterministic
  and checkable, and logprobs stay finite.

The token of a position travels as hidden-state values: `lookup` writes each ID as DIGITS base-256 digits (exact in
float16 and bfloat16 too) and the forward reads them back, so nothing beside the runner's own inputs is needed. A
position holding image features reads as token 0; one holding supplied prompt-embeds rows reads its first DIGITS
values (rounded, clamped to 0..255) as digits. The weights are still loaded (the tokenizer, the vocabulary and the
shapes are the model's); nothing writes the key/value slot buffers, so the prefix cache keeps no block (its keys are
still made) and the runner's row bookkeeping (joins, leaves, forks, chunked prefill) runs as it would.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Any, ClassVar, TypeVar

import torch

from engine.models.attention import PACKED
from engine.models.base import ModelFamily, StepInputs
from splice.errors import FailedPrecondition

PROMPT_POSITIONS_PER_FORWARD = 512  # prompt positions a forward prefills in the time of one decode step
DIGITS = 3  # base-256 digits of a token ID in a hidden row: IDs below 2**24
LEAD = 1e4  # the chosen token's logit above the others' 0: exp(-LEAD) is 0 in float32, so its probability is 1
PROMPT_POSITIONS = "simulated_prompt_positions"  # the forward_kwargs entry: prompt positions of this forward

T = TypeVar("T", int, torch.Tensor)


def simulated_next(token: T, position: T, vocab: int) -> T:
    """The token the simulated model gives after `token` at position id `position` (ints or long tensors alike)."""
    return (token * 31 + position * 7 + 1) % vocab


def simulated_chain(ids: list[int], n: int, vocab: int) -> list[int]:
    """The n tokens the simulated model gives greedily after prompt `ids` (1-D positions 0..len-1), each from the one
    before."""
    out, last = [], ids[-1]
    for position in range(len(ids) - 1, len(ids) - 1 + n):
        last = simulated_next(last, position, vocab)
        out.append(last)
    return out


def forward_seconds(ms: float, decode_rows: int, prompt_positions: int) -> float:
    """What a forward of `decode_rows` decoding rows and `prompt_positions` prompt positions waits."""
    steps = (1 if decode_rows else 0) + math.ceil(prompt_positions / PROMPT_POSITIONS_PER_FORWARD)
    return ms / 1000 * steps


def to_digits(ids: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """IDs [...] -> rows [..., width] holding each ID's base-256 digits (most significant first), zeros after."""
    rows = torch.zeros(*ids.shape, width, dtype=dtype, device=ids.device)
    for k in range(DIGITS):
        rows[..., k] = (ids >> (8 * (DIGITS - 1 - k))) & 255
    return rows


def from_digits(rows: torch.Tensor) -> torch.Tensor:
    """rows [..., width] -> IDs [...] long: the inverse of to_digits (values rounded and clamped to 0..255)."""
    d = rows[..., :DIGITS].float().nan_to_num(0.0).round().clamp(0, 255).long()
    out = d[..., 0]
    for k in range(1, DIGITS):
        out = out * 256 + d[..., k]
    return out


class Device:
    """A simulated accelerator's queue: work launched runs one call after another; `synchronize` waits for all of it
    (time.sleep: no CPU held, the GIL released)."""

    def __init__(self) -> None:
        self.due = 0.0  # time.monotonic() when everything launched so far is done

    def launch(self, seconds: float) -> None:
        if seconds > 0:
            self.due = max(self.due, time.monotonic()) + seconds

    def synchronize(self) -> None:
        left = self.due - time.monotonic()
        if left > 0:
            time.sleep(left)


class SimulatedBackbone:
    """The text stack: inputs_embeds [rows, q, hidden] (tokens as digits) and position ids -> last_hidden_state [rows,
    q, hidden] holding each position's next token as digits; the forward's time is launched on `device`. The cache is
    not touched."""

    def __init__(self, ms: float, vocab: int, device: Device) -> None:
        self.ms = ms
        self.vocab = vocab
        self.device = device

    def __call__(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        packed = kwargs.get(PACKED)
        if packed is not None:  # one row: a decode token per running row, then the prompt segments
            rows, prompt = packed.rows, sum(s.length for s in packed.segments)
        else:
            prompt = kwargs.get(PROMPT_POSITIONS, 0)
            rows = 0 if prompt else inputs_embeds.shape[0]
        positions = position_ids[0] if position_ids.dim() == 3 else position_ids  # M-RoPE: the temporal ids
        nexts = simulated_next(from_digits(inputs_embeds), positions.to(inputs_embeds.device).long(), self.vocab)
        hidden = to_digits(nexts, inputs_embeds.shape[-1], inputs_embeds.dtype)
        self.device.launch(forward_seconds(self.ms, rows, prompt))
        return SimpleNamespace(last_hidden_state=hidden)


class Simulated(ModelFamily):
    """Placed before a family class (`simulated`): its model calls are replaced, its geometry, positions, masks and
    cache kind stay its own."""

    simulate_ms: ClassVar[float] = 0.0

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.hidden_size = int(self.embed.weight.shape[1])
        if self.hidden_size < DIGITS:
            raise FailedPrecondition(f"--simulate-forward-ms needs a hidden size >= {DIGITS}, got {self.hidden_size}")
        head = self.lm_head
        self.vocab = int(getattr(head, "out_features", None) or head.weight.shape[0])  # the real logits' width
        self.simulated_device = Device()
        self.backbone = SimulatedBackbone(self.simulate_ms, self.vocab, self.simulated_device)

    def synchronize(self) -> None:
        self.simulated_device.synchronize()

    def select_impl(self, impl: str, tensor_parallel: bool = False) -> str:
        self.impl = "simulated"
        return self.impl

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return to_digits(ids, self.hidden_size, self.dtype)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = self.images.expected_rows(inputs)  # (validated before: this is the family's own count)
        self.simulated_device.launch(self.simulate_ms / 1000)
        return torch.zeros(rows, self.hidden_size, dtype=self.dtype, device=self.device)

    def forward_kwargs(self, step: StepInputs, embeds: torch.Tensor) -> dict[str, Any]:
        """The prompt positions of a prefill (its new columns' real ones); a decode step has no image mask."""
        if step.image_mask is None:
            return {}
        q = step.token_ids.shape[1]
        return {PROMPT_POSITIONS: int(step.mask[:, -q:].sum())}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> float logits [rows, vocab]: LEAD at each row's next token, 0 elsewhere."""
        chosen = from_digits(hidden).clamp(max=self.vocab - 1)
        out = torch.zeros(hidden.shape[0], self.vocab, device=hidden.device)
        return out.scatter_(1, chosen[:, None], LEAD)


F = TypeVar("F", bound=ModelFamily)


def simulated(family: type[F], ms: float) -> type[F]:
    """`family` with its model calls simulated: a forward waits `ms` ms (see the module's docstring)."""
    return type(f"Simulated{family.__name__}", (Simulated, family), {"simulate_ms": ms})
