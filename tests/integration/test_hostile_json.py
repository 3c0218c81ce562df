"""Issue 40 on real processes (engine + preprocessor on tiny-text, hermes tool parser, both faces): deep JSON in tools,
tool call arguments, structured specs and a model's own tool calls; tools, logit_bias and allowed_token_ids past their
bounds; grammars that would not hold. Each is a 400 / INVALID_ARGUMENT naming the part (or, for a model's output,
content), never a 500, INTERNAL or a cut stream, and the stack keeps serving. Work that grows with a request (a large
body's parse, 1024 tools' checks, a whole answer's JSON) runs off the event loop: another user's request sent while it
runs is answered before it."""

from __future__ import annotations

import json
import socket
import threading
import time

import grpc
import httpx
import pytest
from google.protobuf import json_format, struct_pb2

from app.launch import start_stack
from app.scrape import scrape, total
from preprocessor.tools.request import MAX_TOOLS
from splice.json_depth import MAX_JSON_DEPTH
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc

MODEL = "tiny-text"
HI = [{"role": "user", "content": "Hi"}]
GUARD = 300.0  # seconds: a hang guard, not a timing assertion
# the model's output forced by a grammar to a hermes call that opens 1500 arrays
DEEP_CALL = 'root ::= "<tool_call>" ' + " ".join(['"["'] * 1500)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.fixture(scope="module")
def stack(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=["--metrics-port", "0"],
                              preprocessor_args=["--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=f"http://{stack[1].http_address}", timeout=GUARD) as c:
        yield c


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(stack[1].address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        yield preprocessor_pb2_grpc.PreprocessorStub(channel)


def _chat(http: httpx.Client, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **body})


def _refused(response: httpx.Response, message: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["message"].startswith(message), error


def _grpc_chat(stub, **fields) -> list[preprocessor_pb2.GenerationChunk]:
    request = preprocessor_pb2.ChatRequest(messages=[preprocessor_pb2.ChatMessage(role="user", text="Hi")], **fields)
    if not request.sampling.HasField("max_tokens"):
        request.sampling.max_tokens = 2
    return list(stub.Chat(request, timeout=GUARD))


def _grpc_refused(stub, message: str, **fields) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _grpc_chat(stub, **fields)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details(), err.value


def _struct(value: dict) -> struct_pb2.Struct:
    return json_format.ParseDict(value, struct_pb2.Struct())


def _serves(http: httpx.Client, stub) -> None:
    assert _chat(http).status_code == 200
    assert _grpc_chat(stub)[-1].finish_reason


# --- row 1: a tool nested 100 deep -------------------------------------------------------------------------------

@pytest.mark.parametrize("choice", ["none", "required"])
def test_a_deep_tool_is_refused_naming_it_and_its_depth(http, stub, choice):
    tool = {"type": "function", "function": {"name": "deep", "parameters": _deep_schema(100)}}
    _refused(_chat(http, tools=[tool], tool_choice=choice),
             f"tools[0] (function 'deep') nests 203 levels of arrays and objects; at most {MAX_JSON_DEPTH}")
    shallow = {"type": "function", "function": {"name": "deep", "parameters": _deep_schema(15)}}  # (protobuf
    _grpc_refused(stub, "tools[0] (function 'deep') nests 33 levels", tools=[_struct(shallow)],  # parses ~34)
                  tool_choice=struct_pb2.Value(string_value=choice))
    _serves(http, stub)


# --- row 2: an assistant turn whose call's arguments are '['*5000 ------------------------------------------------

def test_deep_tool_call_arguments_are_refused_naming_the_message(http, stub):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "user", "content": "y"}]
    where = "messages[1].tool_calls[0].function.arguments nests 5000 levels"
    _refused(http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2}), where)
    pb = preprocessor_pb2.ChatRequest(messages=[
        preprocessor_pb2.ChatMessage(role="user", text="x"),
        preprocessor_pb2.ChatMessage(role="assistant", tool_calls=[_struct(call)]),
        preprocessor_pb2.ChatMessage(role="user", text="y")], sampling=common_pb2.SamplingParams(max_tokens=2))
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Chat(pb, timeout=GUARD))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and where in err.value.details()
    _serves(http, stub)


# --- row 3: the model's output read as deep JSON by the tool parser ---------------------------------------------

def test_a_model_call_too_deep_to_parse_is_content_whole_streamed_and_over_grpc(http, stub):
    body = {"messages": HI, "max_tokens": 1600, "tools": [TOOL], "guided_grammar": DEEP_CALL}
    for n in (1, 4):
        reply = http.post("/v1/chat/completions", json={**body, "n": n})
        assert reply.status_code == 200, reply.text
        for choice in reply.json()["choices"]:
            message = choice["message"]  # (vLLM's: no tool_calls key when there is no call)
            assert message["content"] == "<tool_call>" + "[" * 1500 and not message.get("tool_calls")
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)  # (cut mid-body before)
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                   if json.loads(e[6:])["choices"])
    assert text == "<tool_call>" + "[" * 1500
    chunks = _grpc_chat(stub, tools=[_struct(TOOL)], sampling=common_pb2.SamplingParams(
        max_tokens=1600, structured=common_pb2.StructuredOutput(kind=common_pb2.StructuredOutput.KIND_GRAMMAR,
                                                                 spec=DEEP_CALL)))
    assert "".join(c.text for c in chunks) == "<tool_call>" + "[" * 1500 and not any(c.tool_calls for c in chunks)


# --- row 6: a structured spec nested 1000 deep -------------------------------------------------------------------

def test_a_deep_spec_is_refused_from_its_shape_on_both_faces(http, stub):
    deep = '{"items":' * 1000 + "{}" + "}" * 1000
    _refused(_chat(http, guided_json=deep), "guided_json: structured output json nests 1001 levels")
    _refused(_chat(http, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(
        '{"items":' * 500 + "{}" + "}" * 500)}}), "response_format: structured output json nests 501 levels")
    spec = '{"items":' * 900 + "{}" + "}" * 900
    _grpc_refused(stub, "structured output json nests 901 levels", sampling=common_pb2.SamplingParams(
        max_tokens=2, structured=common_pb2.StructuredOutput(kind=common_pb2.StructuredOutput.KIND_JSON, spec=spec)))
    _serves(http, stub)


# --- row 7: 60,000 tools ------------------------------------------------------------------------------------------

def test_tools_past_the_cap_are_counted_and_refused(http, stub):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
             for i in range(60_000)]
    _refused(_chat(http, tools=tools, tool_choice="none"), f"tools holds more than {MAX_TOOLS} entries")
    _grpc_refused(stub, f"the request has 60000 tools; at most {MAX_TOOLS}", tools=[_struct(t) for t in tools],
                  tool_choice=struct_pb2.Value(string_value="none"))
    _serves(http, stub)


# --- rows 8, 8b: logit_bias with millions of entries, allowed_token_ids with 10M --------------------------------

def test_token_id_controls_past_the_vocabulary_are_refused_naming_them(http, stub, stack):
    vocab = _vocab(stub)
    raw = (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logit_bias": {'
           + b",".join(b'"%d": 1.0' % i for i in range(2_000_000)) + b"}}")
    _refused(http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}),
             f"logit_bias holds more than {vocab} entries")
    raw = (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "allowed_token_ids": ['
           + b",".join([b"1"] * 10_000_000) + b"]}")  # (a 429 'message larger than max' from the engine before)
    _refused(http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}),
             f"allowed_token_ids holds more than {vocab} entries")
    small = (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "allowed_token_ids": ['
             + b",".join([b"1"] * (vocab + 1)) + b"]}")  # (a body FastAPI parses itself: the sampling rules count)
    _refused(http.post("/v1/chat/completions", content=small, headers={"content-type": "application/json"}),
             f"allowed_token_ids holds {vocab + 1} entries, more than the engine's vocabulary of {vocab}")
    _grpc_refused(stub, f"logit_bias holds 100000 entries, more than the engine's vocabulary of {vocab}",
                  sampling=common_pb2.SamplingParams(max_tokens=2, logit_bias={i: 1.0 for i in range(100_000)}))
    _grpc_refused(stub, f"allowed_token_ids holds 1000000 entries, more than the engine's vocabulary of {vocab}",
                  sampling=common_pb2.SamplingParams(max_tokens=2, allowed_token_ids=[1] * 1_000_000))
    _serves(http, stub)


def _vocab(stub) -> int:
    return stub.GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=GUARD).vocab_rows


# --- row 13: grammars that would not hold ------------------------------------------------------------------------

def test_grammars_that_would_not_hold_are_refused(http):
    _refused(_chat(http, guided_json={"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}),
             "guided_json: structured output json: schema.properties['a'].$ref 'file:///etc/passwd' points outside")
    _refused(_chat(http, guided_json={"type": "string", "maxLength": -1}),
             "guided_json: structured output json: the schema is not valid JSON Schema at ['maxLength']")
    _refused(_chat(http, guided_json={"type": "object", "properties": {}, "required": ["a"],
                                      "additionalProperties": False}), "guided_json: structured output json: schema "
                                                                       "requires 'a'")
    _refused(_chat(http, guided_regex="[a-z]+", min_tokens=1), "sampling.min_tokens cannot be kept beside")


# --- the event loop: work that grows with a request runs beside other users' requests ----------------------------

def _raw_post(address: str, path: str, body: bytes) -> tuple[socket.socket, threading.Thread, list[float]]:
    """Sends the whole request on a socket of its own; a thread reads the answer and records when its status line
    arrived (done[0])."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                 f"\r\nConnection: close\r\n\r\n".encode() + body)
    done: list[float] = []

    def read() -> None:
        sock.settimeout(GUARD)
        first = sock.recv(64)
        done.append(time.monotonic())
        while first and sock.recv(1 << 20):
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return sock, thread, done


def _answered_first(http: httpx.Client, reader: threading.Thread, hostile: list[float], what: str) -> None:
    """Another user's request, sent now, is answered before the hostile one (`reader` records when its answer came)."""
    assert _chat(http).status_code == 200
    other = time.monotonic()
    reader.join(GUARD)
    assert hostile and other < hostile[0], f"the other user was answered only after {what}"


def test_checking_a_thousand_tools_holds_no_other_user(http, stack):
    """1024 valid tools (the cap; each checked against the JSON Schema metaschema, then refused as too long for the
    context): another user's request sent once the body is out is answered before them (before: every tool checked,
    twice, on the event loop, and nobody answered meanwhile)."""
    props = {f"p{i}": {"type": "string", "description": "a field " * 4} for i in range(12)}
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "a tool " * 8,
                                               "parameters": {"type": "object", "properties": props}}}
             for i in range(MAX_TOOLS)]
    body = json.dumps({"messages": HI, "max_tokens": 2, "tools": tools, "tool_choice": "none"}).encode()
    sock, reader, hostile = _raw_post(stack[1].http_address, "/v1/chat/completions", body)
    try:
        _answered_first(http, reader, hostile, "the 1024 tools")
    finally:
        sock.close()


def test_building_a_large_whole_answer_holds_no_other_user(http, stack):
    """Issue 40 row 14: a whole answer of 32 choices x 1000 tokens with 20 logprobs each (~100 MB of JSON, within its
    charge): once the engine has finished generating it, another user's request is answered before its first byte
    (before: built and encoded on the event loop)."""
    engine = stack[0]
    finished = total(scrape(engine), "splice_engine_requests_finished_total")
    body = json.dumps({"messages": HI, "max_tokens": 1000, "n": 32, "ignore_eos": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    sock, reader, hostile = _raw_post(stack[1].http_address, "/v1/chat/completions", body)
    try:
        deadline = time.monotonic() + GUARD
        while total(scrape(engine), "splice_engine_requests_finished_total") < finished + 32:
            assert time.monotonic() < deadline and not hostile, "the 32 choices did not finish"
            time.sleep(0.01)
        _answered_first(http, reader, hostile, "the whole answer was built")
    finally:
        sock.close()
