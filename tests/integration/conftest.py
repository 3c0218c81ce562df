"""Integration fixtures: the engine and the preprocessor as real processes on loopback ports."""

from __future__ import annotations

import pytest

from app.demo import embedding_rows, sample_picture
from app.launch import start_stack

MODEL = "tiny-idefics3"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tiny_dirs):
    """One engine + preprocessor for the tests that leave them running."""
    engine, pre = start_stack(MODEL, engine_args=["--max-running-seqs", "4"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="session")
def model_dir(tiny_dirs):
    return tiny_dirs[MODEL]


@pytest.fixture(scope="session")
def mixed_messages(model_dir):
    """Two prompt-embeds spans of different lengths (rows of the model's own table) and an image."""
    return [{"role": "user", "content": [
        {"type": "text", "text": "First soft prompt:"},
        {"type": "prompt_embeds", "prompt_embeds": embedding_rows(model_dir, [5, 6, 7])},
        {"type": "text", "text": " then a picture "},
        {"type": "image", "image": sample_picture(80, 40)},
        {"type": "text", "text": " and a second one:"},
        {"type": "prompt_embeds", "prompt_embeds": embedding_rows(model_dir, [10, 11, 12, 13, 14, 15, 16])},
        {"type": "text", "text": " Describe it."},
    ]}]


API_KEY = "test-key"


@pytest.fixture(scope="session")
def media_root(tmp_path_factory):
    """Files for the HTTP face's image URLs: served over loopback (http:) and allowed locally (file:)."""
    root = tmp_path_factory.mktemp("media")
    sample_picture(80, 40).save(root / "pic.png")
    (root / "big.bin").write_bytes(b"\x89PNG" + b"\0" * HTTP_MAX_IMAGE_BYTES)
    return root


HTTP_MAX_IMAGE_BYTES = 256 * 1024
HTTP_MEDIA_TIMEOUT = 2.0


@pytest.fixture(scope="session")
def media_server(media_root):
    """A loopback http.server over media_root; `/slow` answers after longer than the fetch time limit."""
    import functools
    import threading
    import time
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/slow":
                time.sleep(HTTP_MEDIA_TIMEOUT * 2)
            return super().do_GET()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(media_root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="session")
def http_stack(tiny_dirs, media_root, media_server):
    """One engine + preprocessor with the HTTP face (API key, loopback media, engine metrics) for the HTTP tests.
    The key reaches the preprocessor through SPLICE_API_KEY, as users set it; only its process sees it."""
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"SPLICE_API_KEY": API_KEY}):
        engine, pre = start_stack(
            MODEL, http_port=0, engine_args=["--max-running-seqs", "4", "--metrics-port", "0"],
            preprocessor_args=["--allowed-media-domains", media_server.removeprefix("http://"),
                               "--allowed-media-dir", str(media_root),
                               "--max-image-bytes", str(HTTP_MAX_IMAGE_BYTES),
                               "--media-fetch-timeout", str(HTTP_MEDIA_TIMEOUT)])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(http_stack):
    """The official openai SDK on http_stack's HTTP face (with its key; no retries, so a refusal shows as it is)."""
    import openai

    with openai.OpenAI(base_url=f"http://{http_stack[1].http_address}/v1", api_key=API_KEY, timeout=120,
                       max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def grpc_client(http_stack):
    """Splice's gRPC client on http_stack's preprocessor (the same process as `client`'s HTTP face)."""
    from clients import SpliceClient

    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as c:
        yield c
