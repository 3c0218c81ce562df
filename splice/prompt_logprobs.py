"""A prompt's logprobs (SamplingParams.prompt_logprobs, vLLM's field): plain data, its wire form and how a long
prompt's are split into pieces that keep every message small, and joined again.

Position p's entry is about the prompt's token at p given the tokens before it (the logits of position p - 1), so
position 0 has none, as vLLM's list starts with None. The logprobs are of the model's raw distribution, as vLLM
reports them (no penalty, bias or temperature).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from splice.v1 import common_pb2

# Positions per wire piece: with 20 alternatives a position is ~150 bytes, so a piece stays near 300 KiB, far below
# gRPC's 4 MiB default receive limit, whatever the prompt's length.
PIECE_POSITIONS = 2048


@dataclass(frozen=True)
class PromptLogprobs:
    """Positions [first, first + len(token_ids)) of a prompt; a whole prompt's has first 0."""

    token_ids: tuple[int, ...]  # the prompt's token IDs at these positions
    # for each position but position 0 (so one fewer when first == 0): the prompt token's logprob and rank (how many
    # tokens are at least as likely), and the k most likely tokens there with their logprobs, k per position
    logprobs: tuple[float, ...] = ()
    ranks: tuple[int, ...] = ()
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()
    first: int = 0

    def __post_init__(self) -> None:
        scored = len(self.token_ids) - (1 if self.first == 0 and self.token_ids else 0)
        if len(self.logprobs) != scored or len(self.ranks) != scored:
            raise ValueError(f"prompt logprobs: {len(self.logprobs)} logprobs and {len(self.ranks)} ranks for "
                             f"{scored} scored positions")
        if len(self.top_ids) != len(self.top_logprobs) or (scored and len(self.top_ids) % scored) or \
                (not scored and self.top_ids):
            raise ValueError(f"prompt logprobs: {len(self.top_ids)} top IDs and {len(self.top_logprobs)} top "
                             f"logprobs for {scored} scored positions")

    @property
    def k(self) -> int:
        """Alternatives per position."""
        return len(self.top_ids) // len(self.logprobs) if self.logprobs else 0

    def entries(self) -> list[tuple[int, float, int, tuple[tuple[int, float], ...]] | None]:
        """Per position of a whole prompt: None at position 0, else (token ID, logprob, rank, ((top ID, logprob),
        ...) most likely first)."""
        k = self.k
        out: list[tuple[int, float, int, tuple[tuple[int, float], ...]] | None] = [None] if self.token_ids else []
        for i, (token, lp, rank) in enumerate(zip(self.token_ids[1:], self.logprobs, self.ranks, strict=True)):
            tops = tuple(zip(self.top_ids[i * k:(i + 1) * k], self.top_logprobs[i * k:(i + 1) * k], strict=True))
            out.append((token, lp, rank, tops))
        return out

    def to_pb(self) -> common_pb2.PromptLogprobs:
        return common_pb2.PromptLogprobs(first_position=self.first, token_ids=self.token_ids, logprobs=self.logprobs,
                                         ranks=self.ranks, top_token_ids=self.top_ids, top_logprobs=self.top_logprobs)

    @classmethod
    def from_pb(cls, pb: common_pb2.PromptLogprobs) -> PromptLogprobs:
        return cls(tuple(pb.token_ids), tuple(pb.logprobs), tuple(pb.ranks), tuple(pb.top_token_ids),
                   tuple(pb.top_logprobs), pb.first_position)

    def split(self, positions: int | None = None) -> list[PromptLogprobs]:
        """Pieces of at most `positions` (default PIECE_POSITIONS) positions each, in order (just this one when it is
        that short)."""
        positions = positions or PIECE_POSITIONS
        if len(self.token_ids) <= positions:
            return [self]
        k, pieces = self.k, []
        for at in range(0, len(self.token_ids), positions):
            # scored entries of positions [at, at + positions): position p's is entry p - 1 of a whole prompt's
            lo, hi = max(at - 1, 0), min(at + positions, len(self.token_ids)) - 1
            pieces.append(PromptLogprobs(self.token_ids[at:at + positions], self.logprobs[lo:hi], self.ranks[lo:hi],
                                         self.top_ids[lo * k:hi * k], self.top_logprobs[lo * k:hi * k], at))
        return pieces

    @classmethod
    def join(cls, pieces: Sequence[PromptLogprobs]) -> PromptLogprobs:
        """Pieces of one prompt, in order, as one whole; ValueError when they do not follow each other from 0."""
        at = 0
        for piece in pieces:
            if piece.first != at:
                raise ValueError(f"prompt logprobs piece at position {piece.first}, expected {at}")
            at += len(piece.token_ids)
        if len(pieces) == 1:
            return pieces[0]
        return cls(*(tuple(x for p in pieces for x in getattr(p, name))
                     for name in ("token_ids", "logprobs", "ranks", "top_ids", "top_logprobs")))


def split_messages(prompt_logprobs: PromptLogprobs | None, message: Callable[[PromptLogprobs | None], object],
                   piece: Callable[[PromptLogprobs], object]) -> list:
    """The wire messages of one output: `piece(p)` for each leading piece of a long prompt's logprobs, then
    `message(last piece or None)`, the output itself."""
    if prompt_logprobs is None:
        return [message(None)]
    *lead, last = prompt_logprobs.split()
    return [*(piece(p) for p in lead), message(last)]


class Pieces:
    """A receiver's side of split_messages: `add` each message's piece; `take` joins them once the message
    carrying the output (tokens or the end) arrives."""

    def __init__(self) -> None:
        self._pieces: list[PromptLogprobs] = []

    def add(self, piece: PromptLogprobs | None) -> None:
        if piece is not None:
            self._pieces.append(piece)

    def take(self) -> PromptLogprobs | None:
        pieces, self._pieces = self._pieces, []
        return PromptLogprobs.join(pieces) if pieces else None
