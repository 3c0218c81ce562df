"""The HTTP face over raw HTTP: error bodies and statuses, malformed requests, disconnects, remote media,
auth, and the non-/v1 routes (health, metrics, tokenize, detokenize, OpenAPI)."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import time

import httpx
import pytest

from app.scrape import Samples, scrape, value
from preprocessor.http.options import HttpOptions
from preprocessor.server import PreprocessorServer
from tests.integration.conftest import API_KEY, HTTP_MAX_IMAGE_BYTES, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http(http_stack):
    with httpx.Client(base_url=f"http://{http_stack[1].http_address}", headers=AUTH, timeout=120) as c:
        yield c


def _running(samples: Samples) -> float:
    return value(samples, "splice_engine_num_requests_running")


def _aborted(samples: Samples) -> float:
    return value(samples, "splice_engine_requests_finished_total", finish_reason="abort")


def _wait_for(engine, done, timeout: float = 30.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(engine)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def _error(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body
    return body["error"]


def _msgs(content) -> dict:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


MALFORMED: list[tuple[str, bytes | dict]] = [
    ("/v1/chat/completions", b""),
    ("/v1/chat/completions", b"{"),
    ("/v1/chat/completions", b"[]"),
    ("/v1/chat/completions", b'"just a string"'),
    ("/v1/chat/completions", b"\xff\xfe\x00garbage"),
    ("/v1/chat/completions", {"model": MODEL}),
    ("/v1/chat/completions", {"model": MODEL, "messages": "Hi"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"content": "Hi"}]}),
    ("/v1/chat/completions", _msgs(5)),
    ("/v1/chat/completions", _msgs([{"type": "video", "video": "x"}])),
    ("/v1/chat/completions", _msgs([{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}}])),
    ("/v1/chat/completions", _msgs([{"type": "image_url", "image_url": {"url": "ftp://host/pic.png"}}])),
    ("/v1/chat/completions", _msgs([{"type": "prompt_embeds", "data": "bm90IGEgdGVuc29y"}])),
    ("/v1/chat/completions", _msgs([{"type": "text", "text": "an <image> placeholder"}])),
    ("/v1/chat/completions", {**_msgs("Hi"), "max_tokens": "many"}),
    ("/v1/chat/completions", {**_msgs("Hi"), "temperature": -1}),
    ("/v1/chat/completions", {**_msgs("Hi"), "top_p": 0}),
    ("/v1/chat/completions", {**_msgs("Hi"), "stop": 5}),
    ("/v1/chat/completions", {**_msgs("Hi"), "stream_options": "yes"}),
    ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}),
    ("/v1/completions", {"model": MODEL, "prompt": [1, "two"]}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "prompt_embeds": 3}),
    ("/tokenize", {"model": MODEL}),
    ("/detokenize", {"model": MODEL, "tokens": "1 2 3"}),
]


def test_malformed_bodies_get_a_4xx_with_a_message_and_the_server_keeps_serving(http):
    assert len(MALFORMED) >= 20
    for path, body in MALFORMED:
        resp = http.post(path, content=body) if isinstance(body, bytes) else http.post(path, json=body)
        assert 400 <= resp.status_code < 500, (path, body, resp.status_code, resp.text)
        _error(resp)
    ok = http.post("/v1/chat/completions", json={**_msgs("Hi"), "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_error_statuses_and_bodies(http):
    missing = http.post("/v1/chat/completions", json={**_msgs("Hi"), "model": "other"})
    assert missing.status_code == 404 and _error(missing)["code"] == 404 and _error(missing)["param"] == "model"
    bad = http.post("/v1/chat/completions", json=_msgs([{"type": "image_url", "image_url": {"url": "ftp://h/p"}}]))
    error = _error(bad)
    assert bad.status_code == 400 and error["code"] == 400 and error["type"] == "BadRequestError"
    assert "messages[0].content[0]" in error["message"]
    streamed = http.post("/v1/chat/completions", json={**_msgs("Hi"), "temperature": -1, "stream": True})
    assert streamed.status_code == 400, "a streamed request the core rejects is a 4xx, not a 200 with an event"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        denied = httpx.post(f"{http.base_url}/v1/chat/completions", json=_msgs("Hi"), headers=headers)
        assert denied.status_code == 401 and _error(denied)["type"] == "AuthenticationError"
    assert http.get("/nowhere").status_code == 404


def test_remote_and_local_images_within_limits(http, media_server, media_root):
    def ask(url: str) -> httpx.Response:
        return http.post("/v1/chat/completions", json=_msgs([{"type": "image_url", "image_url": {"url": url}},
                                                              {"type": "text", "text": "What is it?"}]))

    by_data = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"{media_server}/pic.png"}}]}]}).json()
    by_file = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": (media_root / "pic.png").as_uri()}}]}]}).json()
    assert by_data["tokens"] == by_file["tokens"] and by_data["count"] > 10
    assert ask(f"{media_server}/pic.png").status_code == 200
    port = media_server.rsplit(":", 1)[1]
    for url, words in [(f"http://localhost:{port}/pic.png", "not in --allowed-media-domains"),
                       (f"{media_server}/big.bin", f"larger than {HTTP_MAX_IMAGE_BYTES}"),
                       (f"{media_server}/slow", "took longer than"),
                       (f"{media_server}/absent.png", "HTTP 404"),
                       ("file:///etc/passwd", "outside the allowed media directory")]:
        resp = ask(url)
        assert resp.status_code == 400 and words in _error(resp)["message"], (url, resp.text)


def test_tokenize_detokenize_models_health_metrics_docs(http):
    tok = http.post("/tokenize", json={"model": MODEL, "prompt": "hello world", "add_special_tokens": False,
                                       "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] > 0
    assert http.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}).json() == {"prompt": "hello world"}
    chat_tok = http.post("/tokenize", json={"model": MODEL, "messages": HI}).json()
    assert chat_tok["count"] > tok["count"]
    assert http.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert httpx.get(f"{http.base_url}/health").status_code == 200  # no key needed
    assert httpx.get(f"{http.base_url}/version").json() == {"version": importlib.metadata.version("splice")}
    for path in ("/metrics", "/openapi.json", "/docs"):  # the key covers them (--open-metrics, --open-docs)
        assert httpx.get(f"{http.base_url}{path}").status_code == 401, path
    metrics = http.get("/metrics").text
    assert "splice_preprocessor_engine_connected 1.0" in metrics
    assert http.get("/openapi.json").json()["paths"]["/v1/chat/completions"]


def _long(stream: bool) -> dict:
    return {**_msgs("Tell a long story."), "max_tokens": 1500, "ignore_eos": True, "stream": stream}


def test_disconnect_frees_the_engine_slot(http, http_stack):
    engine, pre = http_stack
    before = scrape(engine)
    with http.stream("POST", "/v1/chat/completions", json=_long(True)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        assert _running(scrape(engine)) >= 1
    after = _wait_for(engine, lambda s: _running(s) == 0 and _aborted(s) > _aborted(before))
    assert _running(after) == 0 and _aborted(after) == _aborted(before) + 1

    # Not streamed: the answer is not ready when the client leaves; the engine sequence is aborted all the same.
    host, port = pre.http_address.rsplit(":", 1)
    body = json.dumps(_long(False)).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        _wait_for(engine, lambda s: _running(s) >= 1)
    final = _wait_for(engine, lambda s: _running(s) == 0 and _aborted(s) > _aborted(after))
    assert _running(final) == 0 and _aborted(final) == _aborted(after) + 1
    assert http.post("/v1/chat/completions", json=_msgs("Hi")).status_code == 200


async def test_health_and_requests_are_503_until_the_engine_answers():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    server = PreprocessorServer(engine=dead, poll_interval=0.2, http=HttpOptions(port=0))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as c:
            assert (await c.get("/health")).status_code == 503
            resp = await c.post("/v1/chat/completions", json=_msgs("Hi"))
            assert resp.status_code == 503 and _error(resp)["type"] == "ServiceUnavailableError"
    finally:
        await server.stop()
