"""Remote images: http(s) URLs fetched only from allowed hosts and ports (--allowed-media-domains HOST:PORT; a bare
HOST: 80 and 443), within the image size cap and a time limit.

Fetched on the event loop (httpx, async), all of a request's URLs at once, after the conversation passed the request
bounds (its image count among them): a request refused anyway fetches nothing. Redirects are not followed, so an
allowed host cannot send the fetch elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
from urllib.parse import urlsplit

import httpx

from preprocessor.content import Conversation, Image, Where
from preprocessor.http.convert import REMOTE_SCHEMES, scheme
from preprocessor.http.options import DEFAULT_PORTS, HttpOptions
from splice.errors import FailedPrecondition, InvalidArgument


async def fetch_remote_images(conv: Conversation, options: HttpOptions, max_bytes: int) -> Conversation:
    """`conv` with each http(s) image part (Image("url", URL), as convert.py leaves it) replaced by the bytes
    fetched from its URL."""
    remote = [p for p in conv.parts(Image) if p.source == "url" and scheme(str(p.value)) in REMOTE_SCHEMES]
    if not remote:
        return conv
    for part in remote:
        _check_allowed(str(part.value), part.where, options)
    async with httpx.AsyncClient(follow_redirects=False, timeout=options.media_timeout, trust_env=False) as client:
        blobs = await asyncio.gather(*(_fetch(client, str(p.value), p.where, options.media_timeout, max_bytes)
                                       for p in remote))
    fetched = {p.where: Image("data", blob, p.where) for p, blob in zip(remote, blobs, strict=True)}
    messages = tuple(dataclasses.replace(m, parts=tuple(fetched.get(p.where, p) if isinstance(p, Image) else p
                                                        for p in m.parts)) for m in conv.messages)
    return dataclasses.replace(conv, messages=messages)


def _check_allowed(url: str, where: Where, options: HttpOptions) -> None:
    """By host AND port: an allowed host's other services (an engine, a metrics port) stay out of reach."""
    if not options.media_hosts:
        raise FailedPrecondition(f"{where}: remote image URLs are disabled; start the preprocessor with "
                                 f"--allowed-media-domains to allow hosts")
    parsed = urlsplit(url)
    try:
        port = parsed.port or (443 if parsed.scheme.lower() == "https" else 80)
    except ValueError:
        raise InvalidArgument(f"{where}: image URL has an invalid port: {url[:80]!r}") from None
    host = (parsed.hostname or "").lower()
    if (host, port) not in options.media_hosts:
        ports = " and ".join(map(str, DEFAULT_PORTS))
        bare = "" if port in DEFAULT_PORTS else f" (a bare host allows ports {ports} only; name HOST:{port})"
        raise InvalidArgument(f"{where}: image host {host}:{port} is not in --allowed-media-domains{bare}")


async def _fetch(client: httpx.AsyncClient, url: str, where: Where, timeout: float, max_bytes: int) -> bytes:
    try:
        async with asyncio.timeout(timeout), client.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise InvalidArgument(f"{where}: fetching the image returned HTTP {resp.status_code}")
            declared = resp.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise InvalidArgument(f"{where}: image is {declared} bytes, larger than {max_bytes} bytes")
            blob = bytearray()
            async for piece in resp.aiter_bytes():
                blob += piece
                if len(blob) > max_bytes:
                    raise InvalidArgument(f"{where}: image is larger than {max_bytes} bytes")
            return bytes(blob)
    except TimeoutError:
        raise InvalidArgument(f"{where}: fetching the image took longer than {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise InvalidArgument(f"{where}: fetching the image failed ({type(exc).__name__}: {exc})") from None
