"""What the core streams back: plain dataclasses, converted to protobuf only in the servicer."""

from __future__ import annotations

from dataclasses import dataclass

STOP = "stop"  # EOS, a stop token ID or a stop string
LENGTH = "length"  # max_tokens or max_model_len
FINISH_REASONS = (STOP, LENGTH)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int  # positions in the prompt: text, image and prompt-embedding positions alike
    completion_tokens: int


@dataclass(frozen=True)
class EngineOutput:
    """One GenerateResponse from the engine."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None  # set on the last output only
    usage: Usage | None = None  # set on the last output only

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {self.finish_reason!r}")


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed piece of the answer."""

    text: str  # never ends inside a multi-byte character
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None  # final chunk only
    usage: Usage | None = None  # final chunk only
    stop_reason: str = ""  # the stop string that ended the output, final chunk only

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class TokenizeResult:
    token_ids: tuple[int, ...]  # what the engine would receive
    embed_spans: tuple[tuple[int, int, int], ...]  # (offset, length, tensor_index)
    prompt: str  # rendered template text, sentinels included
    image_token_counts: tuple[int, ...]
