"""Hostile values in the HTTP face's JSON fields are 400s naming the field, never 500s: integers past what a field
means or its protobuf type holds (every integer field of every request schema, found by walking them, so a field
added later is covered too), and lone surrogates anywhere in the body. SamplingParams refuses the same ranges for
the gRPC face, before a value reaches protobuf."""

from __future__ import annotations

import json
import types
import typing

import annotated_types
import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from preprocessor.http.app import build_app
from preprocessor.http.options import HttpOptions
from splice.errors import InvalidArgument
from splice.sampling import INT_RANGES, SamplingParams
from tests.preprocessor.http_face import http_face

HUGE = 2**64
HI = [{"role": "user", "content": "Hi"}]
BASE = {  # the least body each route's schema accepts
    "ChatCompletionRequest": {"messages": HI, "max_tokens": 2},
    "CompletionRequest": {"prompt": "Hi", "max_tokens": 2},
    "TokenizeChatRequest": {"messages": HI},
    "TokenizeCompletionRequest": {"prompt": "Hi"},
    "DetokenizeRequest": {"tokens": [1]},
}


def _members(annotation) -> list:
    """The types an annotation admits, one level down: the members of a union, the inside of Annotated."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return [typing.get_args(annotation)[0]]
    if origin in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def _bounded(metadata) -> bool:
    metadata = [m for item in metadata for m in (item.metadata if isinstance(item, FieldInfo) else [item])]
    return any(isinstance(m, annotated_types.Ge | annotated_types.Gt) for m in metadata) and \
        any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in metadata)


def _unbounded_ints(annotation, where: str, seen: set) -> list[str]:
    """Where an annotation admits an integer without both a lower and an upper bound."""
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *metadata = typing.get_args(annotation)
        if inner is int:
            return [] if _bounded(metadata) else [where]
        return _unbounded_ints(inner, where, seen)
    if annotation is int:
        return [where]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model_ints(annotation, seen)
    return [w for arg in typing.get_args(annotation) for w in _unbounded_ints(arg, where, seen)]


def _model_ints(model: type[BaseModel], seen: set) -> list[str]:
    if model in seen:
        return []
    seen.add(model)
    out = []
    for name, field in model.model_fields.items():
        if _bounded(field.metadata):
            continue
        out += _unbounded_ints(field.annotation, f"{model.__name__}.{name}", seen)
    return out


def _api_routes(routes) -> list[APIRoute]:
    out = []
    for route in routes:
        if isinstance(route, APIRoute):
            out.append(route)
        elif (router := getattr(route, "original_router", None)) is not None:  # an included router
            out += _api_routes(router.routes)
    return out


def _bodies() -> dict[str, tuple[str, type[BaseModel]]]:
    """Each request schema of the app's routes, by name, with its route's path."""
    app = build_app(link=None, options=HttpOptions(port=0))  # (the link is used only by requests)
    out = {}
    for route in _api_routes(app.routes):
        if route.body_field is not None:
            for model in _members(route.body_field.field_info.annotation):
                out[model.__name__] = (route.path, model)
    return out


def _huge(annotation):
    """A value of the annotation's shape whose integers are HUGE (None if it admits no integer)."""
    for member in _members(annotation):
        if typing.get_origin(member) is typing.Annotated:
            member = typing.get_args(member)[0]
        if member is int:
            return HUGE
        if typing.get_origin(member) is list:
            inner = _huge(typing.get_args(member)[0])
            if inner is not None:
                return [inner]
    return None


def _int_fields() -> list[tuple[str, str, str, object]]:
    cases = []
    for name, (path, model) in _bodies().items():
        for field, info in model.model_fields.items():
            value = _huge(info.annotation)
            if value is not None:
                cases.append((name, path, field, value))
    return cases


def test_every_integer_field_of_every_request_schema_is_bounded():
    bodies = _bodies()
    assert set(bodies) == set(BASE), "a new request schema needs its least body in BASE"
    assert [w for _, model in bodies.values() for w in _model_ints(model, set())] == []


def test_sampling_params_refuse_what_protobuf_cannot_hold():
    """The gRPC face's values arrive within their protobuf types; the HTTP face's arrive as any JSON integer. Both
    meet the same ranges here, so to_pb never overflows ("Value out of range" was a 500)."""
    def fields(name: str, value: int) -> dict:
        if name in ("stop_token_ids", "allowed_token_ids"):
            return {name: (value,)}
        if name == "logprob_token_ids":
            return {name: (value,), "logprobs": True}
        if name == "logit_bias":
            return {name: ((value, 1.0),)}
        return {name: value, "logprobs": True} if name == "top_logprobs" else {name: value}

    for name, (low, high) in INT_RANGES.items():
        at = fields(name, high)
        assert SamplingParams.from_pb(SamplingParams(**at).to_pb()) == SamplingParams(**at)
        for bad in (low - 1, high + 1, HUGE):
            with pytest.raises(InvalidArgument, match=rf"^sampling\.{name}(\[0\]|: token ID -?\d+)? must be in "
                                                      rf"\[{low}, {high}\], got {bad}$"):
                SamplingParams(**fields(name, bad))


async def test_huge_integers_are_400s_naming_the_field(tiny_dirs, tiny):
    cases = _int_fields()
    assert {(name, field) for name, _, field, _ in cases} >= {
        ("ChatCompletionRequest", "max_tokens"), ("ChatCompletionRequest", "top_k"),
        ("ChatCompletionRequest", "stop_token_ids"), ("CompletionRequest", "prompt"), ("DetokenizeRequest", "tokens")}
    async with http_face(tiny_dirs, tiny) as face:
        for name, path, field, value in cases:
            resp = await face.http.post(path, json={**BASE[name], field: value})
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["code"] == 400, (name, field, resp.text)
            assert error["message"].startswith(field) and "less than or equal to" in error["message"], error
        # The issue's own values, with the range in the message.
        for field, value, bound in (("max_tokens", 2**32 + 1, 2**32 - 1), ("max_tokens", HUGE, 2**32 - 1),
                                    ("top_k", 2**40, 2**31 - 1), ("stop_token_ids", [2**31 + 5], 2**31 - 1)):
            resp = await face.http.post("/v1/chat/completions", json={**BASE["ChatCompletionRequest"], field: value})
            assert resp.status_code == 400 and f"less than or equal to {bound}" in resp.text, resp.text
            assert resp.json()["error"]["param"].startswith(field)
        # within the schema's range, max_tokens past the context is vLLM's 400 naming it, not clamped
        whole = tiny["tiny-text"][1].max_model_len
        past = await face.http.post("/v1/chat/completions", json={**BASE["ChatCompletionRequest"],
                                                                  "max_tokens": 2**32 - 1})
        assert past.status_code == 400 and past.json()["error"]["param"] == "max_tokens", past.text
        edges = {"max_tokens": whole, "top_k": -1, "seed": 2**63 - 1}
        ok = await face.http.post("/v1/chat/completions", json={**BASE["ChatCompletionRequest"], **edges})
        assert ok.status_code == 200, ok.text


SURROGATES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {"x\udc00": 1}}, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": HI, "user": "\ud83d"}, "user"),  # an extra field
    ("/v1/completions", {"prompt": ["\udbff"]}, "prompt[0]"),
    ("/tokenize", {"prompt": "a\ud800"}, "prompt"),
    ("/tokenize", {"messages": [{"role": "\ud800", "content": "Hi"}]}, "messages[0].role"),
]


async def test_lone_surrogates_are_400s_naming_where(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny) as face:
        for path, body, where in SURROGATES:
            # json.dumps writes a lone surrogate as its \\ud800 escape, as a hostile client would
            resp = await face.http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            assert resp.status_code == 400, (body, resp.text)
            message = resp.json()["error"]["message"]
            assert where in message and "surrogate" in message, message
        pair = await face.http.post("/tokenize", content=json.dumps({"prompt": "\U0001f600"}),
                                    headers={"content-type": "application/json"})
        assert pair.status_code == 200  # a surrogate pair is one character, not two lone ones
