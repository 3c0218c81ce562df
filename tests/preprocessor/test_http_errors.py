"""The HTTP face's error mapping: every gRPC status the core can raise has exactly one HTTP status, and the body is
vLLM's: `code` the HTTP status, `type` vLLM's class name, `param` the request field at fault."""

from __future__ import annotations

import grpc

from preprocessor.http.errors import HTTP_STATUS, error_type, splice_error_body
from splice import errors
from splice.errors import InvalidArgument, NotFound, Unauthenticated


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
            assert body["error"]["code"] == status and isinstance(body["error"]["code"], int)
            assert set(body["error"]) == {"message", "type", "param", "code"}


def test_types_are_vllms_class_names():
    assert [error_type(s) for s in (400, 401, 404, 429, 500, 503)] == [
        "BadRequestError", "AuthenticationError", "NotFoundError", "RateLimitError", "InternalServerError",
        "ServiceUnavailableError"]
    assert error_type(504) == "Gateway Timeout"  # no class of its own: the status's phrase, as vLLM's


def test_param_names_the_field_the_error_names_first():
    def param(exc):
        return splice_error_body(exc)[1]["error"]["param"]

    assert param(InvalidArgument("sampling.temperature must be in [0, 100], got -1.0")) == "temperature"
    assert param(InvalidArgument("logit_bias: token ID 99999 (index 0) is out of range")) == "logit_bias"
    assert param(InvalidArgument("prompt_embeds[0]: not valid base64")) == "prompt_embeds"
    assert param(InvalidArgument("the prompt is empty")) is None  # names no field
    assert param(InvalidArgument("nothing here", param="prompt")) == "prompt"  # the error's own
    assert param(NotFound("model 'x' is not served here", param="model")) == "model"
