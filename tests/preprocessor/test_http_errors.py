"""The HTTP face's error mapping: every gRPC status the core can raise has exactly one HTTP status."""

from __future__ import annotations

import grpc

from preprocessor.http.errors import HTTP_STATUS, splice_error_body
from splice import errors
from splice.errors import Unauthenticated


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def test_every_grpc_status_but_ok_has_one_http_status():
    assert {c.name for c in grpc.StatusCode if c != grpc.StatusCode.OK} == set(HTTP_STATUS)


def test_the_core_errors_map_as_the_issue_lists():
    want = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429,
            "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "UNAUTHENTICATED": 401}
    assert {k: HTTP_STATUS[k] for k in want} == want
    for cls in (*_subclasses(errors.SpliceError), Unauthenticated):
        if "code" in vars(cls):  # EngineError carries the engine's code per instance
            status, body = splice_error_body(cls("what went wrong"))
            assert status == HTTP_STATUS[cls.code] and body["error"]["message"] == "what went wrong"
            assert body["error"]["code"] == cls.code
