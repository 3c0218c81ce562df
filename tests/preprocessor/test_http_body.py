"""Request bodies on the HTTP face are counted as they arrive, chunked ones (no Content-Length) too: past the byte
cap a 413 before the body is buffered, on any route; beside other requests' bytes a 429; and a response that leaves
a body unread closes the connection instead of draining it."""

from __future__ import annotations

import asyncio
import json

from preprocessor.admission import Admission
from preprocessor.http.admission import PARSE_FACTOR
from preprocessor.http.options import HttpOptions
from tests.preprocessor.http_face import http_face

CAP = 256 * 1024
PIECE = 16 * 1024
GUARD = 30.0  # seconds: a failure guard, not a timing assertion


async def _post_chunked(face, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*face.http_address)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Transfer-Encoding: chunked\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def _send(writer: asyncio.StreamWriter, nbytes: int) -> None:
    for start in range(0, nbytes, PIECE):
        n = min(PIECE, nbytes - start)
        writer.write(b"%x\r\n" % n + b" " * n + b"\r\n")
        await writer.drain()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and the rest of the response, up to the server closing the connection (EOF)."""
    raw = await asyncio.wait_for(reader.read(), GUARD)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), head + b"\n" + body


async def _until(predicate) -> None:
    deadline = asyncio.get_running_loop().time() + GUARD
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "the state was not reached"
        await asyncio.sleep(0.01)


async def test_chunked_bodies_are_counted_as_they_arrive_and_refused_past_the_cap(tiny_dirs, tiny):
    admission = Admission(max_concurrent=8, max_bytes=CAP)
    async with http_face(tiny_dirs, tiny, admission=admission) as face:
        # Half the body limit sent, the body not ended: the request holds its charge already (PARSE_FACTOR x the
        # bytes: what reading and parsing them holds).
        limit = CAP // PARSE_FACTOR
        reader, writer = await _post_chunked(face, "/v1/chat/completions")
        await _send(writer, limit // 2)
        await _until(lambda: admission.held >= limit // 2 * PARSE_FACTOR)

        # A second chunked body does not fit beside it: 429, the connection closed, nothing held for it.
        reader2, writer2 = await _post_chunked(face, "/tokenize")
        await _send(writer2, limit // 2 + PIECE)
        status, text = await _answer(reader2)
        assert status == 429 and b"--max-inflight-request-bytes" in text, text
        writer2.close()

        # The first passes the limit: 413 at that chunk, long before its end (it never ends), the connection closed.
        await _send(writer, limit - limit // 2 + 1)
        status, text = await _answer(reader)
        assert status == 413 and b'"code":413' in text and f"{CAP} bytes".encode() in text, text
        writer.close()
        await _until(lambda: admission.held == 0 and admission.running == 0)

        # Within the cap, a chunked body is served as any other.
        async def pieces():
            yield b'{"prompt": '
            yield b'"hello"}'

        ok = await face.http.post("/tokenize", content=pieces(),
                                  headers={"content-type": "application/json"})
        assert ok.status_code == 200 and ok.json()["count"] >= 1, ok.text
        assert admission.held == 0


async def test_any_route_refuses_a_body_past_the_cap_and_never_drains_an_unread_one(tiny_dirs, tiny):
    admission = Admission(max_concurrent=8, max_bytes=CAP)
    async with http_face(tiny_dirs, tiny, admission=admission) as face:
        for path in ("/v1/chat/completions", "/nowhere", "/health"):
            big = await face.http.post(path, content=b"x" * (CAP + 1))
            assert big.status_code == 413, (path, big.text)
            assert big.json()["error"]["code"] == 413 and big.headers["connection"] == "close"

        # An unknown route answers 404 without reading its (endless) body, and closes instead of draining it.
        reader, writer = await _post_chunked(face, "/nowhere")
        await _send(writer, PIECE)
        status, text = await _answer(reader)
        assert status == 404 and b"connection: close" in text.lower(), text
        writer.close()

        # A body read to its end leaves the connection open for the next request.
        reader, writer = await asyncio.open_connection(*face.http_address)
        body = json.dumps({"prompt": "hello"}).encode()
        for _ in range(2):
            writer.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower(), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
        writer.close()


async def test_a_silent_body_is_abandoned_and_gives_its_place_back(tiny_dirs, tiny):
    """A client that stops sending its body (slow POST) holds its admission place only until the body idle limit."""
    admission = Admission(max_concurrent=8, max_bytes=CAP)
    options = HttpOptions(port=0, body_idle_timeout=1.0)
    async with http_face(tiny_dirs, tiny, http=options, admission=admission) as face:
        reader, writer = await asyncio.open_connection(*face.http_address)
        writer.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "')
        await writer.drain()
        await _until(lambda: admission.running == 1)
        status, text = await _answer(reader)  # (then nothing more is sent)
        assert status == 408 and b'"code":408' in text and b"--upload-idle-timeout" in text, text
        writer.close()
        await _until(lambda: admission.running == 0 and admission.held == 0)
        assert (await face.http.post("/tokenize", json={"prompt": "hello"})).status_code == 200
