"""Remote images on the HTTP face: a request's image parts are counted (and the model's image support checked)
before any URL is fetched, so a request refused anyway sends nothing out; the allowlist names hosts and ports."""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from preprocessor.http.options import HttpOptions
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import png_bytes


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A loopback image server that counts the GETs it answers."""
    root = tmp_path_factory.mktemp("media")
    (root / "pic.png").write_bytes(png_bytes(40, 30))
    hits: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            return super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], hits
    server.shutdown()


def _images(port: int, n: int) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{port}/pic.png"}} for _ in range(n)]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}],
            "max_tokens": 2}


async def test_images_are_counted_before_any_is_fetched(tiny_dirs, tiny, media):
    port, hits = media
    options = HttpOptions(port=0, allowed_media_domains=(f"127.0.0.1:{port}",))
    async with http_face(tiny_dirs, tiny, "tiny-idefics3", http=options) as face:
        hits.clear()
        for path in ("/v1/chat/completions", "/tokenize"):
            body = _images(port, 200)
            if path == "/tokenize":
                body.pop("max_tokens")
            resp = await face.http.post(path, json=body)
            assert resp.status_code == 400 and "200 images; at most 16" in resp.text, resp.text
        assert hits == [], f"{len(hits)} fetches went out for requests refused for their image count"
        one = await face.http.post("/v1/chat/completions", json=_images(port, 1))
        assert one.status_code == 200 and hits == ["/pic.png"], one.text

    async with http_face(tiny_dirs, tiny, "tiny-text", http=options) as face:  # takes no images at all
        hits.clear()
        resp = await face.http.post("/v1/chat/completions", json=_images(port, 1))
        assert resp.status_code == 400 and "does not accept images" in resp.text and hits == [], resp.text


async def test_the_allowlist_names_host_and_port(tiny_dirs, tiny, media):
    port, hits = media
    options = HttpOptions(port=0, allowed_media_domains=(f"127.0.0.1:{port}",))
    async with http_face(tiny_dirs, tiny, "tiny-idefics3", http=options) as face:
        hits.clear()
        own = face.pre.http_port  # the preprocessor's own /metrics: same host, another port
        resp = await face.http.post("/v1/chat/completions", json=_images(own, 1))
        assert resp.status_code == 400 and f"127.0.0.1:{own} is not in --allowed-media-domains" in resp.text, resp.text
        assert (await face.http.post("/v1/chat/completions", json=_images(port, 1))).status_code == 200
        assert hits == ["/pic.png"]

    bare = HttpOptions(port=0, allowed_media_domains=("127.0.0.1",))  # a bare host: ports 80 and 443 only
    async with http_face(tiny_dirs, tiny, "tiny-idefics3", http=bare) as face:
        hits.clear()
        resp = await face.http.post("/v1/chat/completions", json=_images(port, 1))
        assert resp.status_code == 400 and "ports 80 and 443 only" in resp.text and hits == [], resp.text


def test_allowlist_entries():
    allowed = HttpOptions(allowed_media_domains=("Images.Example.com", "10.0.0.5:8080", "[::1]:9000")).media_hosts
    assert allowed == {("images.example.com", 80), ("images.example.com", 443), ("10.0.0.5", 8080), ("::1", 9000)}
    for bad in ("http://x.org", "x.org:port", "x.org/path", "user@x.org", ":80", "x.org:99999"):
        with pytest.raises(ValueError, match="HOST or HOST:PORT"):
            HttpOptions(allowed_media_domains=(bad,))
