"""What the engine serves (splice.v1.ModelInfo as a dataclass). The preprocessor validates against it."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from splice.v1 import common_pb2

TEXT = "text"
PROMPT_EMBEDS = "prompt_embeds"
IMAGE = "image"
_KIND_TO_PB = {TEXT: common_pb2.INPUT_KIND_TEXT, PROMPT_EMBEDS: common_pb2.INPUT_KIND_PROMPT_EMBEDS,
               IMAGE: common_pb2.INPUT_KIND_IMAGE}
_PB_TO_KIND = {v: k for k, v in _KIND_TO_PB.items()}


@dataclass(frozen=True)
class ModelInfo:
    model: str  # name or path as loaded
    architecture: str  # HF class name
    vocab_rows: int  # rows of the input embedding table: every ID must be < this
    hidden_size: int  # columns of an embedding row
    dtype: str  # compute dtype name ("float32", ...)
    max_model_len: int  # prompt + generated
    image_token_id: int | None = None  # vision models only
    input_kinds: tuple[str, ...] = (TEXT, PROMPT_EMBEDS)
    eos_token_ids: tuple[int, ...] = ()

    @property
    def accepts_images(self) -> bool:
        return IMAGE in self.input_kinds

    @functools.cached_property  # every request carries it and every engine call checks it
    def fingerprint(self) -> str:
        """What a request validated against this model depends on. Every request carries it, so an engine
        replica serving another model refuses the request instead of serving it wrong."""
        facts = (self.architecture, self.vocab_rows, self.hidden_size, self.dtype, self.max_model_len,
                 self.image_token_id, self.input_kinds)
        return hashlib.sha256(repr(facts).encode()).hexdigest()[:16]

    @classmethod
    def from_pb(cls, pb: common_pb2.ModelInfo) -> ModelInfo:
        return cls(
            model=pb.model,
            architecture=pb.architecture,
            vocab_rows=pb.vocab_rows,
            hidden_size=pb.hidden_size,
            dtype=pb.dtype,
            max_model_len=pb.max_model_len,
            image_token_id=pb.image_token_id if pb.HasField("image_token_id") else None,
            input_kinds=tuple(_PB_TO_KIND[k] for k in pb.input_kinds if k in _PB_TO_KIND),
            eos_token_ids=tuple(pb.eos_token_ids),
        )

    def to_pb(self) -> common_pb2.ModelInfo:
        pb = common_pb2.ModelInfo(
            model=self.model,
            architecture=self.architecture,
            vocab_rows=self.vocab_rows,
            hidden_size=self.hidden_size,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            input_kinds=[_KIND_TO_PB[k] for k in self.input_kinds],
            eos_token_ids=list(self.eos_token_ids),
        )
        if self.image_token_id is not None:
            pb.image_token_id = self.image_token_id
        return pb
