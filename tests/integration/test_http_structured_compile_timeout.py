"""--structured-compile-timeout end to end through the official `openai` SDK: on a stack whose bound is the smallest a
compile can miss (1 ms; the first compile also loads the tokenizer, and the spec here is a long EBNF chain), a
constrained request is a 400 naming the structured output and the flag, whole or streamed, and the stack keeps serving.
Nothing here depends on how long a compile takes beyond its being more than a millisecond."""

from __future__ import annotations

import openai
import pytest

from app.launch import start_stack

MODEL = "tiny-text"
MSGS = [{"role": "user", "content": "Go."}]
RULES = 1500  # a chain of alternatives, under the 64 KiB spec cap: tens of ms to compile for a 661-token vocabulary


def _chain(tag: str) -> str:
    """An EBNF whose rules call one another in a chain (distinct per `tag`, so each is compiled afresh)."""
    return "\n".join([f'root ::= "{tag}" r0'] + [f'r{i} ::= "a{i}" | "b" r{i + 1}' for i in range(RULES - 1)]
                     + [f'r{RULES - 1} ::= "end"'])


@pytest.fixture(scope="module")
def client(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=["--structured-compile-timeout", "0.001"])
    try:
        with openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key="unused", timeout=120,
                           max_retries=0) as c:
            yield c
    finally:
        pre.stop()
        engine.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_compile_past_the_bound_is_a_400_naming_it_and_the_stack_keeps_serving(client, stream):
    with pytest.raises(openai.BadRequestError, match=r"structured output grammar took longer than 0\.001 s to compile "
                                                     r"\(--structured-compile-timeout\)"):
        reply = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=8, stream=stream,
                                               extra_body={"structured_outputs": {"grammar": _chain(f"s{stream}")}})
        if stream:
            list(reply)
    plain = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, extra_body={"ignore_eos": True})
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 5
