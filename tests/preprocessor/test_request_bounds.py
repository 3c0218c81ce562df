"""Requests that certainly cannot fit the engine's context are refused before they are rendered or tokenized, on
both faces, with a 400 / INVALID_ARGUMENT naming max_model_len: 10 MB of text (chat, completions, Tokenize) and
100k messages took 11-31 s of CPU each to be found too long, or (Tokenize) were answered in full."""

from __future__ import annotations

import grpc
import pytest

from preprocessor.content import Conversation, Message, Text, TokenIds, Where
from preprocessor.limits import Limits
from preprocessor.request_bounds import MIN_CHARS_PER_TOKEN, check_conversation, check_prompt, max_chars
from splice.errors import InvalidArgument
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.http_face import http_face

pb = preprocessor_pb2
BIG = 10_000_000  # characters


def _refused_for_size(message: str) -> bool:
    return "max_model_len" in message and ("characters" in message or "messages" in message
                                           or "parts" in message or "token IDs" in message)


async def test_http_refuses_what_cannot_fit_before_tokenizing(tiny_dirs, tiny):
    text = "hello " * (BIG // 6)
    async with http_face(tiny_dirs, tiny) as face:
        for path, body in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 100_000, "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 5000}],
                                      "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                      "chat_template_kwargs": {"documents": [text]}}),
            ("/v1/completions", {"prompt": text, "max_tokens": 2}),
            ("/v1/completions", {"prompt": list(range(5)) * 1000, "max_tokens": 2}),
            ("/tokenize", {"prompt": text}),
            ("/tokenize", {"messages": [{"role": "user", "content": text}]}),
        ]:
            resp = await face.http.post(path, json=body)
            error = resp.json()["error"]
            assert resp.status_code == 400 and _refused_for_size(error["message"]), (path, resp.text[:300])
        assert (await face.http.post("/tokenize", json={"prompt": "hello"})).status_code == 200


async def test_grpc_refuses_what_cannot_fit_before_tokenizing(tiny_dirs, tiny):
    text = "hello " * (BIG // 6)
    sampling = common_pb2.SamplingParams(max_tokens=2)
    async with http_face(tiny_dirs, tiny) as face:
        stub = preprocessor_pb2_grpc.PreprocessorStub(face.channel)
        calls = [
            lambda: stub.Chat(pb.ChatRequest(messages=[pb.ChatMessage(role="user", text=text)], sampling=sampling)),
            lambda: stub.Chat(pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")] * 100_000,
                                             sampling=sampling)),
            lambda: stub.Complete(pb.CompleteRequest(prompt=[pb.PromptPart(text=text)], sampling=sampling)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call():
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _refused_for_size(err.value.details()), \
                err.value.details()[:300]
        for request in (pb.TokenizeRequest(text=text),
                        pb.TokenizeRequest(chat=pb.ChatRequest(messages=[pb.ChatMessage(role="user", text=text)]))):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Tokenize(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and _refused_for_size(err.value.details())


def test_the_bound_is_the_longest_token_times_max_model_len(tiny):
    files, info = tiny["tiny-text"]
    per = max(files.longest_token, MIN_CHARS_PER_TOKEN)
    assert max_chars(info, files) == info.max_model_len * per
    fits = Conversation((Message("user", (Text("x" * (max_chars(info, files) - 4), Where(0, 0)),), True, 0),))
    check_conversation(fits, info, files, Limits())  # at the bound: the tokenizer decides, not this check
    over = Conversation((Message("user", (Text("x" * (max_chars(info, files) - 3), Where(0, 0)),), True, 0),))
    with pytest.raises(InvalidArgument, match=f"max_model_len {info.max_model_len}"):
        check_conversation(over, info, files, Limits())
    check_prompt([TokenIds((1,) * (info.max_model_len - 1), Where(None, 0))], info, files, Limits())
    with pytest.raises(InvalidArgument, match="token IDs"):
        check_prompt([TokenIds((1,) * info.max_model_len, Where(None, 0))], info, files, Limits())
