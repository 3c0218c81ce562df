"""The LoRA cases of vLLM's tests/entrypoints/openai/completion/test_completion_with_prompt_embeds.py, ported to a
Splice stack as vLLM's run against a vLLM server: each case runs under the base model's name and under the adapter's,
served with vLLM's own flags (--enable-lora, --lora-module in its JSON form with base_model_name, --max-lora-rank 64,
--max-cpu-loras 2) under the name vLLM's test uses, "opt125m-lora". tiny-text stands for opt-125m and its built-in
adapter (app/loras.py) for vLLM's; the cases without a model parameter (prompt logprobs refused, the empty list) are
the base model's and live with the rest of vLLM's prompt-embeds tests.
"""

from __future__ import annotations

import json

import openai
import pytest

from app.demo import embedding_rows, vllm_base64
from app.loras import ensure_lora
from tests.integration.test_vllm_prompt_embeds import serve

MODEL_NAME = "tiny-text"
LORA_SERVING_MODEL_NAME = "opt125m-lora"
EXAMPLE_PROMPTS = ["Hello, my name is", "What is an LLM?"]
MODELS = [MODEL_NAME, LORA_SERVING_MODEL_NAME]


@pytest.fixture(scope="module")
def client(tiny_dirs):
    module = {"name": LORA_SERVING_MODEL_NAME, "path": str(ensure_lora("tiny-text-lora")),
              "base_model_name": MODEL_NAME}
    yield from serve(MODEL_NAME, engine_args=("--enable-lora", "--lora-module", json.dumps(module), "--max-lora-rank",
                                              "64", "--max-cpu-loras", "2"))


@pytest.fixture(scope="module")
def example_prompt_embeds(tiny_dirs) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs[MODEL_NAME])
    return [vllm_base64(embedding_rows(tiny_dirs[MODEL_NAME], tok(p)["input_ids"])) for p in EXAMPLE_PROMPTS]


def _complete(client, model_name, **fields):
    return client.completions.create(model=model_name, prompt=fields.pop("prompt", None), max_tokens=5,
                                     temperature=0.0, **fields)


@pytest.mark.parametrize("model_name", MODELS)
def test_completions_with_prompt_embeds(client, example_prompt_embeds, model_name):
    encoded_embeds, encoded_embeds2 = example_prompt_embeds
    completion = _complete(client, model_name, extra_body={"prompt_embeds": encoded_embeds})
    assert len(completion.choices[0].text) >= 1
    assert completion.choices[0].prompt_logprobs is None

    completion = _complete(client, model_name, extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]})
    assert len(completion.choices) == 2
    assert len(completion.choices[0].text) >= 1 and len(completion.choices[1].text) >= 1

    single_output = _complete(client, model_name, extra_body={"prompt_embeds": encoded_embeds}).choices[0].text
    chunks, finish_reason_count = [], 0
    for chunk in _complete(client, model_name, stream=True, extra_body={"prompt_embeds": encoded_embeds}):
        chunks.append(chunk.choices[0].text)
        finish_reason_count += chunk.choices[0].finish_reason is not None
    assert finish_reason_count == 1
    assert chunk.choices[0].finish_reason == "length" and chunk.choices[0].text
    assert "".join(chunks) == single_output

    chunks_stream_embeds: list[list[str]] = [[], []]
    finish_reason_count = 0
    for chunk in _complete(client, model_name, stream=True,
                           extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]}):
        chunks_stream_embeds[chunk.choices[0].index].append(chunk.choices[0].text)
        finish_reason_count += chunk.choices[0].finish_reason is not None
    assert finish_reason_count == 2
    assert chunk.choices[0].finish_reason == "length" and chunk.choices[0].text
    assert len(chunks_stream_embeds[0]) > 0 and len(chunks_stream_embeds[1]) > 0

    completion_mixed = _complete(client, model_name, prompt="This is a prompt",
                                 extra_body={"prompt_embeds": encoded_embeds})
    assert len(completion_mixed.choices) == 2
    completion_text_only = _complete(client, model_name, prompt="This is a prompt")
    completion_embeds_only = _complete(client, model_name, extra_body={"prompt_embeds": encoded_embeds})
    assert completion_mixed.choices[0].text == completion_embeds_only.choices[0].text
    assert completion_mixed.choices[1].text == completion_text_only.choices[0].text


@pytest.mark.parametrize("model_name", MODELS)
def test_completions_errors_with_prompt_embeds(client, model_name):
    with pytest.raises(openai.BadRequestError):
        _complete(client, model_name, extra_body={"prompt_embeds": "invalid_base64"})


@pytest.mark.parametrize("logprobs_arg", [1, 0])
@pytest.mark.parametrize("model_name", MODELS)
def test_completions_with_logprobs_and_prompt_embeds(client, example_prompt_embeds, logprobs_arg, model_name):
    encoded_embeds, encoded_embeds2 = example_prompt_embeds
    completion = _complete(client, model_name, echo=False, logprobs=logprobs_arg,
                           extra_body={"prompt_embeds": encoded_embeds})
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert len(logprobs.text_offset) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    for top_logprobs in logprobs.top_logprobs[1:]:
        assert max(logprobs_arg, 1) <= len(top_logprobs) <= logprobs_arg + 1
    assert len(logprobs.tokens) == 5

    completion = _complete(client, model_name, echo=False, logprobs=logprobs_arg,
                           extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]})
    assert len(completion.choices) == 2
    for choice in completion.choices:
        logprobs = choice.logprobs
        assert logprobs is not None
        assert len(logprobs.text_offset) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
        for top_logprobs in logprobs.top_logprobs[1:]:
            assert max(logprobs_arg, 1) <= len(top_logprobs) <= logprobs_arg + 1
        assert len(logprobs.tokens) == 5


def test_the_adapter_answers_differently_from_the_base(client, example_prompt_embeds):
    """What makes the LoRA cases mean something here: the adapter's answer is its own."""
    base = _complete(client, MODEL_NAME, extra_body={"prompt_embeds": example_prompt_embeds[0]})
    adapted = _complete(client, LORA_SERVING_MODEL_NAME, extra_body={"prompt_embeds": example_prompt_embeds[0]})
    assert base.choices[0].text != adapted.choices[0].text
