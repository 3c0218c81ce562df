"""Typed Python clients of splice.v1.Preprocessor (sync and asyncio)."""

from clients.async_client import AsyncSpliceClient
from clients.errors import SpliceClientError
from clients.parts import embeds_part, image_embeds_part, image_part, message, text_part
from clients.sync_client import SpliceClient
from clients.types import Chunk
from splice.engine_output import FinishReason, Usage
from splice.security import ClientTLS

__all__ = [
    "AsyncSpliceClient",
    "Chunk",
    "ClientTLS",
    "FinishReason",
    "SpliceClient",
    "SpliceClientError",
    "Usage",
    "embeds_part",
    "image_embeds_part",
    "image_part",
    "message",
    "text_part",
]
