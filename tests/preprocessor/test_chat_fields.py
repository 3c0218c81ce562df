"""vLLM's request fields that change what is served, honoured as vLLM does: return_token_ids, chat's echo,
continue_final_message, add_special_tokens, documents and reasoning_effort (template arguments, through the
model's template in process and a request's template in the sandbox alike)."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2
from transformers import AutoTokenizer

from app.tiny import templates
from preprocessor.content import Conversation, Message, Text, Where
from preprocessor.convert import conversation_from_pb
from preprocessor.http.convert import conversation_from_http
from preprocessor.http.schemas import ChatCompletionRequest
from preprocessor.limits import Limits
from preprocessor.template import render
from splice.errors import InvalidArgument
from splice.v1 import common_pb2, preprocessor_pb2
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import trusting_core

REPLY = "All good."  # the stand-in engine's answer
PREFILL = [{"role": "user", "content": "What is the answer?"}, {"role": "assistant", "content": "The answer is"}]
DOCS = [{"title": "Moon", "text": "The moon is made of rock."}]
# ChatML with the documents and the reasoning effort printed, as RAG / reasoning templates do.
DOC_TEMPLATE = ("{% if documents %}{% for d in documents %}{{ d.title }}: {{ d.text }}\n{% endfor %}{% endif %}"
                "{% if reasoning_effort is defined and reasoning_effort %}effort={{ reasoning_effort }} "
                "thinking={{ enable_thinking }}\n{% endif %}" + templates.CHATML)


def _events(text: str) -> list[dict]:
    return [json.loads(line.removeprefix("data: ")) for line in text.split("\n\n") if line and "[DONE]" not in line]


async def test_return_token_ids(tiny_dirs, tiny):
    tok = tiny["tiny-text"][0].tokenizer
    reply = tok(REPLY, add_special_tokens=False)["input_ids"]
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        body = (await face.http.post("/v1/completions", json={"prompt": ["Once", "upon"], "max_tokens": 8,
                                                              "return_token_ids": True})).json()
        for i, choice in enumerate(body["choices"]):
            sent = next(r for r in face.engine.requests if r.request_id.endswith(f"-{i}"))
            assert choice["prompt_token_ids"] == list(sent.token_ids) and choice["token_ids"] == reply
        plain = (await face.http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8})).json()
        assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["prompt_logprobs"] is None

        r = await face.http.post("/v1/completions", json={"prompt": "Once", "max_tokens": 8, "stream": True,
                                                          "return_token_ids": True})
        chunks = [e["choices"][0] for e in _events(r.text)]
        assert chunks[0]["prompt_token_ids"] == list(face.engine.requests[-1].token_ids)
        assert all(c["prompt_token_ids"] is None for c in chunks[1:])
        assert [t for c in chunks for t in c["token_ids"]] == reply

        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "return_token_ids": True}
        body = (await face.http.post("/v1/chat/completions", json=chat)).json()
        assert body["prompt_token_ids"] == list(face.engine.requests[-1].token_ids)
        assert body["choices"][0]["token_ids"] == reply
        events = _events((await face.http.post("/v1/chat/completions", json={**chat, "stream": True})).text)
        assert events[0]["prompt_token_ids"] == list(face.engine.requests[-1].token_ids)
        assert [t for e in events[1:] for t in e["choices"][0]["token_ids"]] == reply


async def test_echo_and_the_answers_role(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        body = {"messages": PREFILL, "max_tokens": 8, "add_generation_prompt": False, "echo": True}
        message = (await face.http.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "The answer is" + REPLY, "refusal": None,
                           "annotations": None, "audio": None, "function_call": None, "reasoning": None}
        events = _events((await face.http.post("/v1/chat/completions", json={**body, "stream": True})).text)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[1]["choices"][0]["delta"] == {"content": "The answer is"}
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "The answer is" + REPLY
        # the last message has not the answer's role: nothing to echo
        body = {"messages": PREFILL[:1], "max_tokens": 8, "echo": True}
        message = (await face.http.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]
        assert message["content"] == REPLY
        # no generation prompt: the answer takes the last message's role
        body = {"messages": PREFILL[:1], "max_tokens": 8, "add_generation_prompt": False}
        assert (await face.http.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["role"] \
            == "user"


async def test_continue_final_message_leaves_the_last_turn_open(tiny_dirs, tiny):
    hf = AutoTokenizer.from_pretrained(tiny_dirs["tiny-text"])
    expected = hf.apply_chat_template(PREFILL, continue_final_message=True, add_generation_prompt=False)["input_ids"]
    assert hf.decode(expected).endswith("assistant\nThe answer is")
    async with http_face(tiny_dirs, tiny, "tiny-text", limits=Limits(trust_request_chat_template=True)) as face:
        body = {"messages": PREFILL, "max_tokens": 2, "add_generation_prompt": False, "continue_final_message": True}
        assert (await face.http.post("/v1/chat/completions", json=body)).status_code == 200
        assert list(face.engine.requests[-1].token_ids) == expected
        # a request's own template renders in the sandbox: the same
        r = await face.http.post("/v1/chat/completions", json={**body, "chat_template": templates.CHATML})
        assert r.status_code == 200, r.text
        assert list(face.engine.requests[-1].token_ids) == expected
        r = await face.http.post("/v1/chat/completions", json={**body, "add_generation_prompt": True})
        assert r.status_code == 400 and "continue_final_message" in r.json()["error"]["message"]
        tokenized = (await face.http.post("/tokenize", json={k: body[k] for k in (
            "messages", "add_generation_prompt", "continue_final_message")})).json()["tokens"]
        assert tokenized == expected


async def test_chat_add_special_tokens_adds_them_on_top_of_the_template(tiny_dirs, tiny):
    hf = AutoTokenizer.from_pretrained(tiny_dirs["tiny-text-bos"])
    messages = PREFILL[:1]
    hf_ids = hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    async with http_face(tiny_dirs, tiny, "tiny-text-bos") as face:
        body = {"messages": messages, "max_tokens": 2, "add_special_tokens": True}
        assert (await face.http.post("/v1/chat/completions", json=body)).status_code == 200
        assert list(face.engine.requests[-1].token_ids) == [hf.bos_token_id, *hf_ids]  # vLLM's double BOS


def test_documents_and_reasoning_effort_reach_the_models_template(tiny):
    files, _ = tiny["tiny-text"]
    body = ChatCompletionRequest(messages=PREFILL[:1], documents=DOCS, reasoning_effort="low")
    conv = conversation_from_http(body)
    prompt = render(files.tokenizer, DOC_TEMPLATE, conv, None, files.sentinels)
    assert prompt.startswith("Moon: The moon is made of rock.\neffort=low thinking=True\n<|im_start|>user")
    # the caller's chat_template_kwargs may turn thinking off; the request's fields win over theirs
    body = ChatCompletionRequest(messages=PREFILL[:1], reasoning_effort="none",
                                 chat_template_kwargs={"documents": [{"title": "Old", "text": "x"}]})
    kwargs = conversation_from_http(body).template_kwargs
    assert kwargs == {"documents": [{"title": "Old", "text": "x"}], "reasoning_effort": "none",
                      "enable_thinking": False}
    assert conversation_from_http(ChatCompletionRequest(messages=PREFILL[:1], documents=DOCS)).template_kwargs \
        == {"documents": DOCS}


def test_documents_in_a_request_template_and_their_strings_are_checked(tiny):
    files, info = tiny["tiny-text"]
    core = trusting_core(files, info)
    conv = Conversation((Message("user", (Text("Hi", Where(0, 0)),), True, 0),), chat_template=DOC_TEMPLATE,
                        template_kwargs={"documents": DOCS})
    assert core.normalize_chat(conv).prompt.startswith("Moon: The moon is made of rock.\n<|im_start|>user")
    bad = Conversation(conv.messages, template_kwargs={"documents": [{"title": files.sentinels.text(0), "text": ""}]})
    with pytest.raises(Exception, match="reserved"):
        core.normalize_chat(bad)


# The HTTP chat fields the gRPC ChatRequest / SamplingParams do not carry, and why: the rest must be on both faces.
HTTP_ONLY = {
    "model": "one model is served; gRPC has no model field",
    "stream": "gRPC Chat always streams",
    "stream_options": "usage is always on the final chunk",
    "echo": "the caller holds the text it sent",
    "return_token_ids": "gRPC chunks always carry token IDs; Tokenize gives the prompt's",
    "max_completion_tokens": "OpenAI's newer name of SamplingParams.max_tokens",
    "return_tokens_as_token_ids": "how the JSON spells logprobs' tokens; gRPC chunks carry their IDs",
}


# HTTP's ways of asking for a structured output, all one gRPC field: SamplingParams.structured (kind + spec).
STRUCTURED = {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar"}


def test_every_http_chat_field_is_on_the_grpc_face():
    grpc_fields = ({f.name for f in preprocessor_pb2.ChatRequest.DESCRIPTOR.fields}
                   | {f.name for f in common_pb2.SamplingParams.DESCRIPTOR.fields})
    assert "structured" in grpc_fields
    missing = set(ChatCompletionRequest.model_fields) - grpc_fields - set(HTTP_ONLY) - STRUCTURED
    assert not missing, f"HTTP chat fields with no gRPC twin: {sorted(missing)}"


def _chat_pb(**fields):
    def struct(value: dict) -> struct_pb2.Struct:
        s = struct_pb2.Struct()
        s.update(value)
        return s

    messages = [preprocessor_pb2.ChatMessage(role=m["role"], text=m["content"]) for m in fields.pop("messages")]
    docs = [struct(d) for d in fields.pop("documents", [])]
    structs = {k: struct(fields.pop(k)) for k in ("chat_template_kwargs", "mm_processor_kwargs") if k in fields}
    return preprocessor_pb2.ChatRequest(messages=messages, documents=docs, **structs, **fields)


@pytest.mark.parametrize("fields", [
    {"add_generation_prompt": False, "continue_final_message": True},
    {"add_special_tokens": True},
    {"documents": DOCS, "reasoning_effort": "low"},
    {"reasoning_effort": "none", "chat_template_kwargs": {"documents": [{"title": "Old", "text": "x"}], "n": 3}},
    {"mm_processor_kwargs": {"max_pixels": 1024, "do_image_splitting": False}},
])
def test_the_grpc_request_is_the_same_conversation_as_the_http_one(fields):
    body = {"messages": PREFILL, **fields}
    grpc = conversation_from_pb(_chat_pb(**body))
    assert grpc == conversation_from_http(ChatCompletionRequest(**body))
    if "chat_template_kwargs" in fields:  # a Struct's whole number is an int, as JSON's (3 == 3.0 in Python)
        assert type(grpc.template_kwargs["n"]) is int
    if "mm_processor_kwargs" in fields:
        assert type(grpc.mm_processor_kwargs["max_pixels"]) is int


@pytest.mark.parametrize(("fields", "needle"), [
    ({"documents": [{"title": 3}]}, "documents[0].title must be a string"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort must be one of"),
    ({"continue_final_message": True}, "continue_final_message and add_generation_prompt"),
])
def test_bad_grpc_chat_fields_are_refused_by_name(fields, needle):
    with pytest.raises(InvalidArgument) as err:
        conversation_from_pb(_chat_pb(messages=PREFILL, **fields))
    assert needle in err.value.message
