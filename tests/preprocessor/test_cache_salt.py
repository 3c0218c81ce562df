"""vLLM's cache_salt: a field of SamplingParams, checked there (vLLM's rule and words, and a length bound) for every
face, carried unchanged from the HTTP body or the gRPC request to the engine request."""

from __future__ import annotations

import grpc
import pytest

from preprocessor.http.convert import NOT_SERVED
from splice.errors import InvalidArgument
from splice.sampling import MAX_CACHE_SALT, SamplingParams
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.http_face import http_face

VLLM_WORDS = "Parameter 'cache_salt' must be a non-empty string if provided."
HI = [{"role": "user", "content": "Hi"}]
ROUTES = (("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "Hi"}))


def test_the_salt_travels_the_wire_and_unset_stays_unset():
    salted = SamplingParams(cache_salt="tenant-a", temperature=0.0)
    assert salted.to_pb().cache_salt == "tenant-a"
    assert SamplingParams.from_pb(salted.to_pb()) == salted
    assert not SamplingParams().to_pb().HasField("cache_salt")
    assert SamplingParams.from_pb(common_pb2.SamplingParams()).cache_salt is None
    assert SamplingParams(cache_salt="x" * MAX_CACHE_SALT).cache_salt == "x" * MAX_CACHE_SALT


@pytest.mark.parametrize(("salt", "words"), [("", VLLM_WORDS), (3, VLLM_WORDS),
                                             ("x" * (MAX_CACHE_SALT + 1), "sampling.cache_salt is 257 characters")])
def test_an_empty_or_overlong_salt_is_refused_by_name(salt, words):
    with pytest.raises(InvalidArgument) as err:
        SamplingParams(cache_salt=salt)
    assert err.value.message.startswith(words)
    if isinstance(salt, str):  # the gRPC faces' path: the same check
        with pytest.raises(InvalidArgument) as again:
            SamplingParams.from_pb(common_pb2.SamplingParams(cache_salt=salt))
        assert again.value.message == err.value.message


def test_cache_salt_is_served_not_refused():
    assert "cache_salt" not in NOT_SERVED


async def test_http_carries_the_salt_to_the_engine_and_refuses_bad_ones(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        for route, body in ROUTES:
            r = await face.http.post(route, json={**body, "max_tokens": 2, "cache_salt": "tenant-a"})
            assert r.status_code == 200, r.text
            assert face.engine.requests[-1].sampling.cache_salt == "tenant-a"
            r = await face.http.post(route, json={**body, "max_tokens": 2, "cache_salt": None})
            assert r.status_code == 200, r.text
            assert face.engine.requests[-1].sampling.cache_salt is None
            sent = len(face.engine.requests)
            for salt, words in (("", VLLM_WORDS), ("x" * 10_000, "sampling.cache_salt is 10000 characters")):
                r = await face.http.post(route, json={**body, "max_tokens": 2, "cache_salt": salt})
                assert r.status_code == 400 and r.json()["error"]["message"].startswith(words), r.text
            r = await face.http.post(route, json={**body, "max_tokens": 2, "cache_salt": 7})
            assert r.status_code == 400 and "cache_salt" in r.json()["error"]["message"], r.text
            assert len(face.engine.requests) == sent  # refused before the engine was reached


async def test_grpc_carries_the_salt_to_the_engine_and_refuses_bad_ones(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        stub = preprocessor_pb2_grpc.PreprocessorStub(face.channel)
        message = [preprocessor_pb2.ChatMessage(role="user", text="Hi")]
        calls = (lambda s: stub.Chat(preprocessor_pb2.ChatRequest(messages=message, sampling=s)),
                 lambda s: stub.Complete(preprocessor_pb2.CompleteRequest(
                     prompt=[preprocessor_pb2.PromptPart(text="Hi")], sampling=s)))
        for call in calls:
            _ = [c async for c in call(common_pb2.SamplingParams(max_tokens=2, cache_salt="tenant-b"))]
            assert face.engine.requests[-1].sampling.cache_salt == "tenant-b"
            sent = len(face.engine.requests)
            for salt in ("", "x" * (MAX_CACHE_SALT + 1)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    _ = [c async for c in call(common_pb2.SamplingParams(max_tokens=2, cache_salt=salt))]
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cache_salt" in err.value.details()
            assert len(face.engine.requests) == sent
