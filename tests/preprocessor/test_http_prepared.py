"""The HTTP face is built before it serves: what FastAPI builds at its first request (each router's table of routes,
their parameters' validators) is there once the face listens, so a server's first request builds nothing, with an
API key set too (the preparation routes past the middlewares: no key is asked of it)."""

from __future__ import annotations

import fastapi.routing

from preprocessor.http.options import HttpOptions
from tests.preprocessor.http_face import http_face

KEY = "k3y"


async def test_the_first_requests_build_no_route(tiny_dirs, tiny, monkeypatch):
    built = []
    real = fastapi.routing.get_dependant  # what a route's lazy set-up calls for its endpoint and each dependency

    def counted(*args, **kwargs):
        built.append(kwargs.get("call"))
        return real(*args, **kwargs)

    async with http_face(tiny_dirs, tiny, http=HttpOptions(port=0, api_key=KEY), answer="Fine.") as face:
        monkeypatch.setattr(fastapi.routing, "get_dependant", counted)
        completion = await face.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8})
        assert completion.status_code == 200, completion.text
        assert completion.json()["choices"][0]["text"] == "Fine."
        chat = await face.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "Fine.", chat.text
        assert (await face.http.get("/v1/models")).status_code == 200
        assert (await face.http.get("/nowhere")).status_code == 404
    assert built == []
