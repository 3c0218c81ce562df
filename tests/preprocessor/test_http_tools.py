"""Tool calling on the HTTP face through the official `openai` SDK, on a stand-in engine whose answer is a chosen
text (so a Hermes call in it is certain): the call is parsed into message.tool_calls, a stream's deltas reassemble
into the same call, and what vLLM refuses is a 400 naming the field before any engine time."""

from __future__ import annotations

import json

import openai
import pytest

from preprocessor.limits import Limits
from preprocessor.tools.choice import constrain
from splice.sampling import SamplingParams
from splice.structured_output import StructuredOutput
from tests.preprocessor.http_face import http_face

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HERMES = Limits(tool_call_parser="hermes", enable_auto_tool_choice=True)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _sdk(face) -> openai.AsyncOpenAI:
    host, port = face.http_address
    return openai.AsyncOpenAI(base_url=f"http://{host}:{port}/v1", api_key="none", max_retries=0, timeout=60)


async def test_hermes_call_is_parsed(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, limits=HERMES, answer=CALL) as face, _sdk(face) as sdk:
        reply = await sdk.chat.completions.create(model=face.engine.info.model, messages=ASK, tools=[WEATHER])
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me look."
        [call] = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


async def test_streamed_call_reassembles(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, limits=HERMES, answer=CALL) as face, _sdk(face) as sdk:
        stream = await sdk.chat.completions.create(model=face.engine.info.model, messages=ASK, tools=[WEATHER],
                                                   stream=True)
        content, calls, reasons = "", {}, []
        async for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for d in delta.tool_calls or []:
                assert d.type == "function" if d.id else d.type is None  # (a call's first piece names its type)
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or d.id
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            reasons.append(chunk.choices[0].finish_reason)
        assert content == "Let me look."
        assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool-")
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
        assert reasons[-1] == "tool_calls"


async def test_no_call_is_content(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, limits=HERMES, answer="Sunny, I think.") as face, _sdk(face) as sdk:
        reply = await sdk.chat.completions.create(model=face.engine.info.model, messages=ASK, tools=[WEATHER])
        assert reply.choices[0].message.content == "Sunny, I think."
        assert not reply.choices[0].message.tool_calls and reply.choices[0].finish_reason == "length"


async def test_refusals(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny) as face, _sdk(face) as sdk:
        model = face.engine.info.model
        with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
            await sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER])  # "auto" by default
        with pytest.raises(openai.BadRequestError, match="'nope'"):
            await sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                              tool_choice={"type": "function", "function": {"name": "nope"}})
        with pytest.raises(openai.BadRequestError, match="needs tools"):
            await sdk.chat.completions.create(model=model, messages=ASK, tool_choice="required")
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\].function.parameters"):
            await sdk.chat.completions.create(model=model, messages=ASK, tool_choice="none", tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}])
        assert face.engine.requests == []  # all before any engine time
        # "none" renders the tools and answers as text
        reply = await sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none")
        assert reply.choices[0].message.content == "All good." and not reply.choices[0].message.tool_calls


async def test_template_without_tools_is_refused(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, name="tiny-text-bos", limits=HERMES) as face, _sdk(face) as sdk:
        with pytest.raises(openai.BadRequestError, match="tools: this chat template does not render tools"):
            await sdk.chat.completions.create(model=face.engine.info.model, messages=ASK, tools=[WEATHER])
        assert face.engine.requests == []


async def test_constrained_choices_with_a_structured_output_of_their_own_are_refused(tiny_dirs, tiny):
    """required / a named function constrain the answer themselves: a caller's response_format beside them is a
    400 (vLLM silently lets the tool choice win), and nothing reaches the engine."""
    async with http_face(tiny_dirs, tiny, limits=HERMES) as face, _sdk(face) as sdk:
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with pytest.raises(openai.BadRequestError, match="constrains the answer itself"):
                await sdk.chat.completions.create(model=face.engine.info.model, messages=ASK, tools=[WEATHER],
                                                  tool_choice=choice, response_format={"type": "json_object"})
        assert face.engine.requests == []
    constrained = constrain(SamplingParams(), StructuredOutput("json", "{}"))
    assert constrained.structured == StructuredOutput("json", "{}")


async def test_grpc_chat_with_tools(tiny_dirs, tiny):
    """The gRPC face: the same tools through the client, the call on the final chunk with TOOL_CALLS."""
    from clients import AsyncSpliceClient, SpliceClientError

    async with http_face(tiny_dirs, tiny, limits=HERMES, answer=CALL) as face:
        client = AsyncSpliceClient(f"127.0.0.1:{face.pre.port}", timeout=60)
        try:
            chunks = [c async for c in client.chat(ASK, tools=[WEATHER], max_tokens=64)]
            assert "".join(c.text for c in chunks) == "Let me look."
            pieces = [p for c in chunks for p in c.tool_calls]
            assert [(p.index, p.name) for p in pieces] == [(0, "get_weather")] and pieces[0].id.startswith("chatcmpl-")
            assert json.loads(pieces[0].arguments) == {"city": "Paris"} and chunks[-1].finish_reason == "tool_calls"
            # an assistant turn with its call and the tool's reply reach the template
            call = {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "c1", "content": "sunny, 24C"}]
            prompt = (await client.tokenize(history, tools=[WEATHER], tool_choice="none")).prompt
            listed = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
            assert json.loads(listed) == WEATHER  # (a Struct keeps no key order)
            assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
            assert "<tool_response>\nsunny, 24C\n</tool_response>" in prompt
            with pytest.raises(SpliceClientError, match="'nope'") as err:
                [c async for c in client.chat(ASK, tools=[WEATHER],
                                              tool_choice={"type": "function", "function": {"name": "nope"}})]
            assert err.value.code.name == "INVALID_ARGUMENT"
        finally:
            await client.close()


async def test_request_templates_are_checked_for_tools_too(tiny_dirs, tiny):
    """A trusted request template renders in the sandbox: one that never reads `tools` is refused there too."""
    from app.tiny import templates

    limits = Limits(tool_call_parser="hermes", enable_auto_tool_choice=True, trust_request_chat_template=True)
    async with http_face(tiny_dirs, tiny, name="tiny-text-bos", limits=limits, answer=CALL) as face, \
            _sdk(face) as sdk:
        model = face.engine.info.model
        with pytest.raises(openai.BadRequestError, match="does not render tools"):
            await sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                              extra_body={"chat_template": templates.CHATML})
        reply = await sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                                  extra_body={"chat_template": templates.HERMES_CHATML})
        assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert len(face.engine.requests) == 1  # the refused one never reached the engine


async def test_a_stream_of_n_choices_keeps_each_choices_calls():
    """The answer's chunks of n choices interleave (both faces stream them): each choice's text is held and parsed on
    its own."""
    from preprocessor.answer import answer_events
    from preprocessor.outputs import Answered, GenerationChunk
    from preprocessor.tools.parsers import get_parser
    from preprocessor.tools.request import ToolRequest
    from splice.engine_output import FinishReason

    async def engine():
        for piece in ('<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}</tool_call>'):
            yield 0, GenerationChunk(piece, (1,), index=0)
            yield 1, GenerationChunk("Plain " if piece.startswith("<") else "words", (1,), index=1)
        yield 1, GenerationChunk("", (), finish_reason=FinishReason.STOP, index=1)
        yield 0, GenerationChunk("", (), finish_reason=FinishReason.STOP, index=0)

    request = ToolRequest((WEATHER,), "auto")
    events = [e async for e in answer_events(engine(), 2, request, get_parser("hermes"))]
    assert isinstance(events[-1], Answered)
    out = events[:-1]
    assert "".join(c.text for c in out if c.index == 0) == ""
    assert "".join(c.text for c in out if c.index == 1) == "Plain words"
    [call] = [p for c in out if c.index == 0 for p in c.tool_calls]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert [(c.index, c.finish_reason) for c in out if c.final] == [(1, "stop"), (0, "tool_calls")]
