"""The HTTP face answers with vLLM 0.32's shapes (as bench/vs_vllm_api.py sees them side by side): the same keys in
every response, chunk, usage and model card; error bodies with `code` the HTTP status, `type` vLLM's class name and
`param` the field; vLLM's refusals (stream_options without a stream, max_tokens past the context, a stop token
outside the vocabulary); --served-model-name; return_tokens_as_token_ids, per request and as the server's flag.

On a stand-in engine (the engine is not under test): it answers "All good." token by token.
"""

from __future__ import annotations

import json

from preprocessor.http.options import HttpOptions
from preprocessor.limits import Limits
from tests.preprocessor.http_face import http_face

HI = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": HI, "max_tokens": 4}
COMPLETE = {"prompt": "Once", "max_tokens": 4}
# vLLM 0.32's keys
RESPONSE = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
            "kv_transfer_params", "ec_transfer_params", "metrics"}
CHAT_RESPONSE = RESPONSE | {"prompt_logprobs", "prompt_token_ids", "prompt_text"}
CHAT_CHOICE = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
MESSAGE = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
COMPLETION_CHOICE = {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs",
                     "prompt_token_ids", "routed_experts"}
USAGE = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"}
CHUNK = {"id", "object", "created", "model", "choices"}
MODEL_CARD = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}


def _events(text: str) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in text.split("\n\n") if line and "[DONE]" not in line]


async def test_whole_responses_have_vllms_keys(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        chat = (await face.http.post("/v1/chat/completions", json=CHAT)).json()
        assert set(chat) == CHAT_RESPONSE and set(chat["choices"][0]) == CHAT_CHOICE
        assert set(chat["choices"][0]["message"]) == MESSAGE and set(chat["usage"]) == USAGE
        assert chat["usage"]["prompt_tokens_details"] is None and chat["service_tier"] is None
        completion = (await face.http.post("/v1/completions", json=COMPLETE)).json()
        assert set(completion) == RESPONSE and set(completion["choices"][0]) == COMPLETION_CHOICE
        assert completion["choices"][0]["token_ids"] is None and completion["choices"][0]["prompt_token_ids"] is None
        models = (await face.http.get("/v1/models")).json()["data"]
        assert set(models[0]) == MODEL_CARD and models[0]["parent"] is None
        assert models[0]["permission"][0]["object"] == "model_permission"
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        none = (await face.http.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": "none"}))
        assert "tool_calls" not in none.json()["choices"][0]["message"]  # vLLM's: no key when there is no call


async def test_streamed_chunks_have_vllms_keys(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        for usage in (False, True):
            body = {**CHAT, "stream": True, "stream_options": {"include_usage": usage}}
            events = _events((await face.http.post("/v1/chat/completions", json=body)).text)
            assert set(events[0]) == CHUNK | {"prompt_token_ids", "prompt_text"}
            assert set(events[0]["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
            assert all(set(e) == CHUNK and set(e["choices"][0]) == {"index", "delta", "logprobs", "finish_reason",
                                                                   "token_ids"} for e in events[1:-2])
            final = events[-2] if usage else events[-1]
            assert set(final["choices"][0]) == {"index", "delta", "logprobs", "finish_reason", "stop_reason",
                                                "token_ids"} and "content" in final["choices"][0]["delta"]
            assert set(final) == CHUNK | ({"system_fingerprint"} if not usage else set())  # on the last message
            if usage:
                assert set(events[-1]) == CHUNK | {"usage", "system_fingerprint"}
                assert set(events[-1]["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens"}
        events = _events((await face.http.post("/v1/completions", json={**COMPLETE, "stream": True})).text)
        assert all(set(e) == CHUNK for e in events[:-1]) and set(events[-1]) == CHUNK | {"system_fingerprint"}
        assert all(set(e["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                                            "prompt_token_ids", "token_ids"} for e in events)


async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(tiny_dirs, tiny):
    """vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the choice's usage so
    far, its completion tokens those its chunks carried (chat's with completion_tokens_details null, its role chunk
    at 0); the usage chunk still ends the stream; without the option no chunk has usage."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETE)):
            events = _events((await face.http.post(route, json={**body, "stream": True, "return_token_ids": True,
                                                                 "stream_options": options})).text)
            *chunks, last = events
            prompt, generated = last["usage"]["prompt_tokens"], 0
            for e in chunks:
                generated += len(e["choices"][0].get("token_ids") or ())
                assert e["usage"]["completion_tokens"] == generated, (route, e)
                assert e["usage"]["prompt_tokens"] == prompt and e["usage"]["total_tokens"] == prompt + generated
                assert ("completion_tokens_details" in e["usage"]) == (route == "/v1/chat/completions")
            assert generated == last["usage"]["completion_tokens"] > 0, route
            if route == "/v1/chat/completions":
                assert events[0]["choices"][0]["delta"]["role"] == "assistant"
                assert events[0]["usage"]["completion_tokens"] == 0
        plain = _events((await face.http.post("/v1/completions", json={**COMPLETE, "stream": True, "stream_options": {
            "include_usage": True}})).text)
        assert all("usage" not in e for e in plain[:-1]) and "usage" in plain[-1]


async def test_an_empty_delta_is_vllms_with_and_without_a_tool_parser(tiny_dirs, tiny):
    """vLLM's chat stream: a chunk without text (here the final one) has "content": "" unless the server runs a tool
    parser, whose deltas it then goes through: no content key."""
    body = {**CHAT, "stream": True, "max_tokens": 8, "stop": ["All good."]}  # a final chunk of no text
    for limits, delta in ((None, {"content": ""}), (Limits(tool_call_parser="hermes"), {})):
        async with http_face(tiny_dirs, tiny, "tiny-text", limits=limits) as face:
            events = _events((await face.http.post("/v1/chat/completions", json=body)).text)
            assert events[-1]["choices"][0]["finish_reason"] == "stop"
            assert events[-1]["choices"][0]["delta"] == delta


async def test_error_bodies_are_vllms(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        cases = [({**COMPLETE, "temperature": -1}, 400, "BadRequestError", "temperature"),
                 ({**COMPLETE, "top_p": 2}, 400, "BadRequestError", "top_p"),
                 ({**COMPLETE, "prompt": ""}, 400, "BadRequestError", "prompt"),
                 ({**COMPLETE, "model": "nosuch"}, 404, "NotFoundError", "model"),
                 ({**COMPLETE, "logit_bias": {"99999": 1}}, 400, "BadRequestError", "logit_bias"),
                 ({**COMPLETE, "logprobs": 21}, 400, "BadRequestError", "logprobs"),
                 ({**COMPLETE, "prompt_embeds": "!!!", "prompt": None}, 400, "BadRequestError", "prompt_embeds"),
                 ({**COMPLETE, "max_tokens": "many"}, 400, "Bad Request", "body.max_tokens")]  # pydantic's, vLLM's
        for body, status, kind, param in cases:
            error = (await face.http.post("/v1/completions", json=body)).json()["error"]
            assert (error["code"], error["type"], error["param"]) == (status, kind, param), (body, error)
        error = (await face.http.post("/v1/chat/completions", json={**CHAT, "tool_choice": "required"})).json()
        assert error["error"]["param"] == "tool_choice"
        assert (await face.http.post("/v1/nosuch", json={})).json() == {"detail": "Not Found"}  # FastAPI's, vLLM's


async def test_vllms_refusals(tiny_dirs, tiny):
    whole = tiny["tiny-text"][1].max_model_len
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETE)):
            for field, value, param in (("stream_options", {"include_usage": True}, "stream_options"),
                                        ("max_tokens", whole + 1, "max_tokens"),
                                        ("stop_token_ids", [99999], "stop_token_ids")):
                r = await face.http.post(route, json={**body, field: value})
                assert r.status_code == 400 and r.json()["error"]["param"] == param, (route, field, r.text)
            ok = await face.http.post(route, json={**body, "max_tokens": whole, "stream_options": {}})
            assert ok.status_code == 200, ok.text
        assert len(face.engine.requests) == 2  # the refused ones never reached it


async def test_served_model_names(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text", http=HttpOptions(port=0, served_model_names=("a", "b"))) \
            as face:
        assert [m["id"] for m in (await face.http.get("/v1/models")).json()["data"]] == ["a", "b"]
        for name in ("a", "b"):
            r = await face.http.post("/v1/completions", json={**COMPLETE, "model": name})
            assert r.status_code == 200 and r.json()["model"] == "a"  # vLLM's: answers carry the first name
        r = await face.http.post("/v1/completions", json={**COMPLETE, "model": "tiny-text"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"


async def test_return_tokens_as_token_ids(tiny_dirs, tiny):
    ids = tiny["tiny-text"][0].tokenizer("All good.", add_special_tokens=False)["input_ids"]
    as_ids = [f"token_id:{t}" for t in ids]
    body = {**CHAT, "max_tokens": len(ids), "logprobs": True, "top_logprobs": 1}
    complete = {**COMPLETE, "max_tokens": len(ids), "logprobs": 1}

    async def tokens(face, **fields) -> tuple[list[str], list[str]]:
        chat = (await face.http.post("/v1/chat/completions", json={**body, **fields})).json()
        text = (await face.http.post("/v1/completions", json={**complete, **fields})).json()
        return ([c["token"] for c in chat["choices"][0]["logprobs"]["content"]],
                text["choices"][0]["logprobs"]["tokens"])

    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        assert await tokens(face, return_tokens_as_token_ids=True) == (as_ids, as_ids)
        assert (await tokens(face))[0] != as_ids
    async with http_face(tiny_dirs, tiny, "tiny-text", http=HttpOptions(port=0, return_tokens_as_token_ids=True)) \
            as face:
        assert await tokens(face) == (as_ids, as_ids)  # the server's default
        assert (await tokens(face, return_tokens_as_token_ids=False))[1] != as_ids  # a request's own word wins
