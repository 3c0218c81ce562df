"""vLLM's own end-to-end tests of prompt embeddings, ported to a Splice stack as vLLM's run against a vLLM server:
tests/entrypoints/openai/completion/test_completion_with_prompt_embeds.py,
chat_completion/test_chat_completion_with_prompt_embeds.py, chat_completion/test_chat_completion_with_mixed_embeds.py
(prompt_embeds beside image_embeds), chat_completion/test_completion_with_image_embeds.py and the prompt-embeds cases
of completion/test_prompt_validation.py, through the official
`openai` SDK, on tiny-text (a ChatML template, as vLLM's chat test gives opt-125m) and tiny-llava for the image
embeddings (random weights: what is asserted holds whatever the weights; vLLM's tests use opt-125m and
llava-1.5-7b). vLLM's server flags: --enable-prompt-embeds (Splice serves them without one), --enable-mm-embeds.

Left out: the LoRA parametrizations (LoRA is not served here: its own issue), the audio_embeds case (no audio family
here), the sparse layouts of test_load_prompt_embeds (Splice loads one dense tensor only and refuses a sparse one
before loading it: docs/operations.md#security), the --enable-prompt-embeds refusal (no such flag here: they are
always served), and wording vLLM asserts beyond a word of its message.
"""

from __future__ import annotations

import openai
import pytest
import torch

from app.demo import embedding_rows, sample_picture, vllm_base64
from app.launch import start_stack
from tests.integration.test_image_embeds_api import hf_features

MODEL = "tiny-text"
VISION = "tiny-llava"
EXAMPLE_PROMPTS = ["Hello, my name is", "What is an LLM?"]


def serve(model: str, *flags: str, engine_args: tuple[str, ...] = ()):
    """A stack on `model` (preprocessor `flags`, `engine_args`) -> the official client on its HTTP face; stopped
    after."""
    engine, pre = start_stack(model, http_port=0, engine_args=list(engine_args), preprocessor_args=list(flags))
    client = openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key="unused", timeout=120, max_retries=0)
    try:
        yield client
    finally:
        client.close()
        pre.stop()
        engine.stop()


@pytest.fixture(scope="module")
def client(tiny_dirs):
    yield from serve(MODEL)


@pytest.fixture(scope="module")
def vision_client(tiny_dirs):
    yield from serve(VISION, "--enable-mm-embeds")


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dirs[MODEL])


def _rows(tiny_dirs, tokenizer, text: str, special: bool = True) -> torch.Tensor:
    """The model's own embedding rows of `text`'s tokens (vLLM's hf_runner.get_prompt_embeddings)."""
    return embedding_rows(tiny_dirs[MODEL], tokenizer(text, add_special_tokens=special)["input_ids"])


@pytest.fixture(scope="module")
def example_prompt_embeds(tiny_dirs, tokenizer) -> list[str]:
    return [vllm_base64(_rows(tiny_dirs, tokenizer, p)) for p in EXAMPLE_PROMPTS]


def _complete(client, **fields):
    return client.completions.create(model=MODEL, prompt=fields.pop("prompt", None), max_tokens=5, temperature=0.0,
                                     **fields)


# -- completions (test_completion_with_prompt_embeds.py) ----------------------------------------------------------

def test_completions_with_prompt_embeds(client, example_prompt_embeds):
    encoded_embeds, encoded_embeds2 = example_prompt_embeds
    completion = _complete(client, extra_body={"prompt_embeds": encoded_embeds})
    assert len(completion.choices[0].text) >= 1
    assert completion.choices[0].prompt_logprobs is None

    completion = _complete(client, extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]})
    assert len(completion.choices) == 2
    assert len(completion.choices[0].text) >= 1 and len(completion.choices[1].text) >= 1

    single_output = _complete(client, extra_body={"prompt_embeds": encoded_embeds}).choices[0].text
    chunks, finish_reason_count = [], 0
    for chunk in _complete(client, stream=True, extra_body={"prompt_embeds": encoded_embeds}):
        chunks.append(chunk.choices[0].text)
        finish_reason_count += chunk.choices[0].finish_reason is not None
    assert finish_reason_count == 1
    assert chunk.choices[0].finish_reason == "length" and chunk.choices[0].text
    assert "".join(chunks) == single_output

    chunks_stream_embeds: list[list[str]] = [[], []]
    finish_reason_count = 0
    for chunk in _complete(client, stream=True, extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]}):
        chunks_stream_embeds[chunk.choices[0].index].append(chunk.choices[0].text)
        finish_reason_count += chunk.choices[0].finish_reason is not None
    assert finish_reason_count == 2
    assert chunk.choices[0].finish_reason == "length" and chunk.choices[0].text
    assert len(chunks_stream_embeds[0]) > 0 and len(chunks_stream_embeds[1]) > 0

    completion_mixed = _complete(client, prompt="This is a prompt", extra_body={"prompt_embeds": encoded_embeds})
    assert len(completion_mixed.choices) == 2
    completion_text_only = _complete(client, prompt="This is a prompt")
    completion_embeds_only = _complete(client, extra_body={"prompt_embeds": encoded_embeds})
    # the embeddings' choices come first
    assert completion_mixed.choices[0].text == completion_embeds_only.choices[0].text
    assert completion_mixed.choices[1].text == completion_text_only.choices[0].text


def test_completions_errors_with_prompt_embeds(client):
    with pytest.raises(openai.BadRequestError):
        _complete(client, extra_body={"prompt_embeds": "invalid_base64"})


@pytest.mark.parametrize("logprobs_arg", [1, 0])
def test_completions_with_logprobs_and_prompt_embeds(client, example_prompt_embeds, logprobs_arg):
    encoded_embeds, encoded_embeds2 = example_prompt_embeds
    completion = _complete(client, echo=False, logprobs=logprobs_arg, extra_body={"prompt_embeds": encoded_embeds})
    batch = _complete(client, echo=False, logprobs=logprobs_arg,
                      extra_body={"prompt_embeds": [encoded_embeds, encoded_embeds2]})
    assert len(batch.choices) == 2
    for choice in (completion.choices[0], *batch.choices):
        logprobs = choice.logprobs
        assert logprobs is not None
        assert len(logprobs.text_offset) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
        for top_logprobs in logprobs.top_logprobs[1:]:
            assert max(logprobs_arg, 1) <= len(top_logprobs) <= logprobs_arg + 1
        assert len(logprobs.tokens) == 5


def test_prompt_logprobs_raises_error(client, example_prompt_embeds):
    with pytest.raises(openai.BadRequestError, match="not compatible"):
        _complete(client, extra_body={"prompt_embeds": example_prompt_embeds[0], "prompt_logprobs": True})


def test_empty_prompt_embeds(client):
    _complete(client, prompt="Hello", extra_body={"prompt_embeds": []})


def test_empty_prompt(client):  # (test_prompt_validation.py)
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, extra_body={"prompt_embeds": []})
    assert err.value.body["param"] == "prompt"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq_len", [2, 10])
def test_load_prompt_embeds(tiny_dirs, dtype, seq_len):  # (test_prompt_validation.py; the strided layout)
    """Any floating dtype loads, cast to the engine's: the rows as sent."""
    from preprocessor.content import Embeds, Where
    from preprocessor.embeds import decode_embeds
    from preprocessor.limits import Limits
    from tests.preprocessor.pp_factories import model_info_from_config

    info = model_info_from_config(tiny_dirs[MODEL])
    tensor = torch.randn((seq_len, info.hidden_size), dtype=dtype)
    loaded = decode_embeds(Embeds("torch_base64", vllm_base64(tensor), Where(None, 0, "prompt_embeds")), info,
                           Limits())
    assert loaded.device.type == "cpu" and loaded.layout == torch.strided
    torch.testing.assert_close(loaded, tensor.to(loaded.dtype))


# -- chat (test_chat_completion_with_prompt_embeds.py) ------------------------------------------------------------

def _chat(client, content, model: str = MODEL, **fields):
    messages = content if isinstance(content, list) and content and "role" in content[0] else \
        [{"role": "user", "content": content}]
    return client.chat.completions.create(model=model, max_tokens=5, temperature=0.0, messages=messages, **fields)


def test_single_prompt_embeds_part(client, example_prompt_embeds):
    chat = _chat(client, [{"type": "prompt_embeds", "data": example_prompt_embeds[0]},
                          {"type": "text", "text": "Continue:"}])
    assert chat.choices[0].message.content is not None and len(chat.choices[0].message.content) > 0


def test_multiple_prompt_embeds_parts(client, example_prompt_embeds):
    b64_a, b64_b = example_prompt_embeds
    chat = _chat(client, [{"type": "prompt_embeds", "data": b64_a}, {"type": "text", "text": " and "},
                          {"type": "prompt_embeds", "data": b64_b}])
    assert chat.choices[0].message.content is not None and len(chat.choices[0].message.content) > 0


def test_multi_message_conversation(client, example_prompt_embeds):
    b64_sys, b64_usr = example_prompt_embeds
    chat = _chat(client, [
        {"role": "system", "content": [{"type": "text", "text": "You are helpful."},
                                       {"type": "prompt_embeds", "data": b64_sys}]},
        {"role": "user", "content": [{"type": "prompt_embeds", "data": b64_usr},
                                     {"type": "text", "text": "Summarize."}]}])
    assert chat.choices[0].message.content is not None and len(chat.choices[0].message.content) > 0


def test_streaming(client, example_prompt_embeds):
    content = [{"type": "prompt_embeds", "data": example_prompt_embeds[0]}, {"type": "text", "text": "Continue:"}]
    expected = _chat(client, content).choices[0].message.content
    chunks = [c.choices[0].delta.content for c in _chat(client, content, stream=True) if c.choices[0].delta.content]
    assert "".join(chunks) == expected


def test_text_content_and_prompt_embeds_match(client, tiny_dirs, tokenizer):
    """Equal content in text and prompt_embeds (its tokens without special tokens) gives the same greedy answer."""
    content = "Hello, my name is"
    encoded_embeds = vllm_base64(_rows(tiny_dirs, tokenizer, content, special=False))
    text_out = client.chat.completions.create(model=MODEL, max_tokens=10, temperature=0.0,
                                              messages=[{"role": "user", "content": content}])
    embeds_out = client.chat.completions.create(
        model=MODEL, max_tokens=10, temperature=0.0,
        messages=[{"role": "user", "content": [{"type": "prompt_embeds", "data": encoded_embeds}]}])
    text_out, embeds_out = text_out.choices[0].message.content, embeds_out.choices[0].message.content
    assert text_out is not None and len(text_out) > 0 and embeds_out is not None and len(embeds_out) > 0
    assert text_out == embeds_out


def test_missing_data_field(client):
    with pytest.raises(openai.BadRequestError):
        _chat(client, [{"type": "prompt_embeds"}])


def test_invalid_base64(client):
    with pytest.raises(openai.BadRequestError):
        _chat(client, [{"type": "prompt_embeds", "data": "not_valid_base64!!"}])


# -- with image embeddings (test_chat_completion_with_mixed_embeds.py, test_completion_with_image_embeds.py) --------

@pytest.fixture(scope="module")
def image_embeds(tiny_dirs) -> torch.Tensor:
    """A picture's own precomputed features (vLLM's test asset: a stop sign's), from the HF model's vision tower."""
    return hf_features(tiny_dirs[VISION], sample_picture(80, 40))[0]


def test_prompt_embeds_plus_image_embeds(vision_client, tiny_dirs, image_embeds):
    hidden = embedding_rows(tiny_dirs[VISION], [0]).shape[1]
    chat = _chat(vision_client, [{"type": "prompt_embeds", "data": vllm_base64(torch.randn(4, hidden))},
                                 {"type": "image_embeds", "image_embeds": vllm_base64(image_embeds)},
                                 {"type": "text", "text": "Continue."}], model=VISION)
    assert chat.choices[0].message.content is not None and len(chat.choices[0].message.content) > 0


@pytest.mark.parametrize("dtype", [torch.half, torch.float16, torch.float32])
def test_completions_with_image_embeds(vision_client, image_embeds, dtype):
    chat = vision_client.chat.completions.create(model=VISION, max_tokens=16, messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [
            {"type": "text", "text": "Describe these images separately. For each image,"
                                     "reply with a short sentence (no more than 10 words)."},
            {"type": "image_embeds", "image_embeds": vllm_base64(image_embeds.to(dtype))}]}])
    assert isinstance(chat.choices[0].message.content, str) and len(chat.choices[0].message.content) > 0
