"""Caps on what a request may make the preprocessor decode, allocate or run, checked before allocation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from preprocessor.sentinel import MAX_EMBEDS_PARTS
from preprocessor.tools.request import ToolSettings

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_image_bytes: int = 20 * MiB  # encoded file size
    max_image_pixels: int = 4096 * 4096  # width * height, checked from the header before decoding
    max_image_side: int = 8192  # width and height each, from the header
    max_image_aspect_ratio: float = 200.0  # longer side / shorter side, from the header
    max_images: int = 16  # per request
    max_request_image_pixels: int = 4 * 4096 * 4096  # a request's images together, from their headers
    max_embeds_bytes: int = 256 * MiB  # per prompt_embeds part, as its dense tensor in the source dtype
    max_embeds_parts: int = 32  # per request
    # Prompts per request (OpenAI's batch form of /v1/completions): each is its own engine request, so this caps
    # what one request may queue. vLLM's VLLM_MAX_COMPLETION_PROMPTS is 1024.
    max_prompts: int = 256
    allowed_media_dir: Path | None = None  # local image paths are refused unless this is set
    # Request chat templates are programs: refused unless trusted, then rendered in killable worker processes.
    trust_request_chat_template: bool = False
    chat_template_timeout: float = 2.0  # seconds a request template may take to render (queueing included)
    chat_template_workers: int = 2  # worker processes rendering request templates
    max_chat_template_bytes: int = 256 * 1024
    upload_idle_timeout: float = 30.0  # seconds an Upload stream may stay silent before it is abandoned
    # image_embeds parts (precomputed image features) are refused unless this is set (vLLM's --enable-mm-embeds)
    enable_mm_embeds: bool = False
    # tool calling (vLLM's flags): the parser that finds calls in an answer, and whether tool_choice "auto" (the
    # default with tools) is served; without it only "none", "required" and a named function are
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # JSON grammars (structured outputs, tool calls) allow no whitespace between tokens (vLLM's
    # --structured-outputs-config.disable_any_whitespace); off: any whitespace JSON allows, xgrammar's default
    disable_any_whitespace: bool = False

    @property
    def tools(self) -> ToolSettings:
        return ToolSettings(self.tool_call_parser, self.enable_auto_tool_choice)

    def __post_init__(self) -> None:
        self.tools  # noqa: B018 (ValueError for a parser there is not, or auto without one)
        for name in ("max_image_bytes", "max_image_pixels", "max_image_side", "max_image_aspect_ratio", "max_images",
                     "max_request_image_pixels", "max_embeds_bytes", "max_embeds_parts", "max_prompts",
                     "chat_template_workers", "max_chat_template_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_embeds_parts > MAX_EMBEDS_PARTS:
            raise ValueError(f"Limits.max_embeds_parts must be <= {MAX_EMBEDS_PARTS} (one sentinel token per part), "
                             f"got {self.max_embeds_parts}")
        for name in ("chat_template_timeout", "upload_idle_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)}")
        if self.allowed_media_dir is not None and not Path(self.allowed_media_dir).is_dir():
            raise ValueError(f"allowed media dir {self.allowed_media_dir} is not a directory")
