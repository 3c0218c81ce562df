"""The HTTP face as the official `openai` SDK sees it (sync and async, streamed and not), each part kind and field."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
import torch
from safetensors.torch import save as save_safetensors

from app.demo import embedding_rows, sample_picture
from clients import SpliceClient
from tests.integration.conftest import API_KEY, MODEL

MAX_TOKENS = 6


def torch_b64(tensor: torch.Tensor) -> str:
    """vLLM's prompt_embeds encoding."""
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return base64.b64encode(buf.getvalue()).decode()


def png_data_url(width: int = 80, height: int = 40) -> str:
    buf = io.BytesIO()
    sample_picture(width, height).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def base_url(http_stack):
    return f"http://{http_stack[1].http_address}/v1"


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key=API_KEY, timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture
async def aclient(base_url):
    async with openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def soft_prompt(model_dir):
    return embedding_rows(model_dir, [5, 6, 7, 8])


def test_reproducer_four_messages_text_embeds_image_text_at_temperature_0(client, soft_prompt):
    """The report's request: a prompt_embeds part and an image_url part in one chat, on a model whose
    sentinel lies beyond its vocabulary. It must generate, not 400."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Here is a soft prompt."}]},
        {"role": "user", "content": [{"type": "prompt_embeds", "data": torch_b64(soft_prompt)}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_data_url()}}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe both."}]},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=MAX_TOKENS,
                                           extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == MAX_TOKENS
    assert reply.model == MODEL and reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")


def test_streamed_usage_and_text_equal_the_whole_response(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Count with me."}], temperature=0,
                  max_completion_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert text == whole.choices[0].message.content and finishes == [whole.choices[0].finish_reason]


def test_stop_string_seed_and_logprobs(client):
    base = dict(model=MODEL, messages=[{"role": "user", "content": "Say something."}], max_tokens=12,
                extra_body={"ignore_eos": True})
    greedy = client.chat.completions.create(temperature=0, logprobs=True, **base)
    text = greedy.choices[0].message.content
    lps = greedy.choices[0].logprobs.content
    assert len(lps) == greedy.usage.completion_tokens and all(lp.logprob <= 0 for lp in lps)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    stopped = client.chat.completions.create(temperature=0, stop=[stop], **base)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[:text.index(stop)]
    seeded = [client.chat.completions.create(temperature=1.0, top_p=0.9, seed=7, **base).choices[0].message.content
              for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_same_answer_as_grpc_and_vllm_extras(client, http_stack):
    """Both faces share one core: the greedy answer is the same; the first generated ID as a stop token
    ends the HTTP answer after one token."""
    msgs = [{"role": "user", "content": "Hi"}]
    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as grpc_client:
        grpc_chunks = list(grpc_client.chat(msgs, temperature=0.0, max_tokens=MAX_TOKENS))
    probe = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=MAX_TOKENS)
    assert probe.choices[0].message.content == "".join(c.text for c in grpc_chunks)
    reply = client.chat.completions.create(
        model=MODEL, messages=msgs, temperature=0, max_tokens=MAX_TOKENS,
        extra_body={"stop_token_ids": [grpc_chunks[0].token_ids[0]], "top_k": 5, "skip_special_tokens": True,
                    "chat_template_kwargs": {}, "add_generation_prompt": True})
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 1
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    for extra in ({"chat_template": template}, {"chat_template_kwargs": {"chat_template": template}}):
        with pytest.raises(openai.BadRequestError) as refused:  # not trusted: no --trust-request-chat-template
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1, extra_body=extra)
        assert "--trust-request-chat-template" in str(refused.value)


def test_safetensors_marker_matches_vllm_encoding(client, soft_prompt):
    def ask(data: str) -> str:
        content = [{"type": "prompt_embeds", "data": data}, {"type": "text", "text": "Continue."}]
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                              temperature=0, max_tokens=MAX_TOKENS).choices[0].message.content

    safetensors = "safetensors:" + base64.b64encode(save_safetensors({"e": soft_prompt.contiguous()})).decode()
    assert ask(safetensors) == ask(torch_b64(soft_prompt))


def test_completions_text_ids_and_prompt_embeds(client, soft_prompt, http_stack):
    text = client.completions.create(model=MODEL, prompt="Once upon", temperature=0, max_tokens=MAX_TOKENS,
                                     logprobs=0)
    assert text.object == "text_completion" and text.choices[0].text
    assert len(text.choices[0].logprobs.token_logprobs) == text.usage.completion_tokens
    with httpx.Client(base_url=str(client.base_url).removesuffix("/v1/"),
                      headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        ids = raw.post("/tokenize", json={"model": MODEL, "prompt": "Once upon", "add_special_tokens": False}
                       ).json()["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=MAX_TOKENS)
    assert by_ids.choices[0].text == text.choices[0].text
    embeds = client.completions.create(model=MODEL, prompt="", temperature=0, max_tokens=MAX_TOKENS,
                                       extra_body={"prompt_embeds": torch_b64(soft_prompt)})
    assert embeds.usage.prompt_tokens == soft_prompt.shape[0] and embeds.choices[0].text
    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as grpc_client:
        rows = grpc_client.model_info().vocab_rows
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt=[1, 2, rows + 5], max_tokens=2)
    assert bad.value.status_code == 400 and str(rows + 5) in bad.value.message


def test_unsupported_values_and_unknown_model_are_clear(client):
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match=r"n must be in \[1, 128\]"):  # (n > 1: test_http_n.py)
        client.chat.completions.create(model=MODEL, messages=msgs, n=129, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="use_beam_search is not supported"):
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2,
                                       extra_body={"use_beam_search": True})
    with pytest.raises(openai.BadRequestError, match=r"response_format\.type must be"):
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2,
                                       response_format={"type": "yaml"})
    off = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0, presence_penalty=0,
                                         logit_bias={}, response_format={"type": "text"},
                                         extra_body={"repetition_penalty": 1.0, "min_p": 0.0})
    assert off.choices[0].message.content == client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=2, temperature=0).choices[0].message.content
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0).models.list()
    assert [m.id for m in client.models.list()] == [MODEL]


async def test_async_stream_with_every_part_kind(aclient, soft_prompt, media_server, media_root):
    content = [
        {"type": "text", "text": "Soft:"},
        {"type": "prompt_embeds", "data": torch_b64(soft_prompt)},
        {"type": "image_url", "image_url": {"url": png_data_url()}},
        {"type": "image_url", "image_url": {"url": f"{media_server}/pic.png"}},
        {"type": "image_url", "image_url": {"url": (media_root / "pic.png").as_uri()}},
        {"type": "prompt_embeds", "data": torch_b64(soft_prompt[:2])},
        {"type": "text", "text": "Describe."},
    ]
    stream = await aclient.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        temperature=0, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = await aclient.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        temperature=0, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
    assert whole.usage == chunks[-1].usage


async def test_async_completions_stream(aclient, soft_prompt):
    stream = await aclient.completions.create(model=MODEL, prompt="", temperature=0, max_tokens=MAX_TOKENS,
                                              stream=True, stream_options={"include_usage": True},
                                              extra_body={"prompt_embeds": [torch_b64(soft_prompt)],
                                                          "ignore_eos": True})
    chunks = [c async for c in stream]
    whole = await aclient.completions.create(model=MODEL, prompt="", temperature=0, max_tokens=MAX_TOKENS,
                                             extra_body={"prompt_embeds": torch_b64(soft_prompt),
                                                         "ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage and whole.usage.prompt_tokens == soft_prompt.shape[0]


async def test_completions_batches_as_vllm_serves_them(aclient, soft_prompt):
    """vLLM's own prompt-embeds test (tests/entrypoints/openai/completion/test_completion_with_prompt_embeds.py):
    a list of prompt_embeds is a batch, `prompt` next to prompt_embeds is another prompt (the embeddings first),
    and a batch streams each choice under its index."""
    e1, e2 = torch_b64(soft_prompt), torch_b64(soft_prompt[:2])
    greedy = dict(model=MODEL, temperature=0, max_tokens=5, extra_body={"ignore_eos": True})

    async def one(**kwargs) -> str:
        return (await aclient.completions.create(**{**greedy, **kwargs})).choices[0].text

    only1 = await one(prompt=None, extra_body={"prompt_embeds": e1, "ignore_eos": True})
    only2 = await one(prompt=None, extra_body={"prompt_embeds": e2, "ignore_eos": True})
    text_only = await one(prompt="This is a prompt")

    batch = await aclient.completions.create(**{**greedy, "prompt": None,
                                                "extra_body": {"prompt_embeds": [e1, e2], "ignore_eos": True}})
    assert [c.index for c in batch.choices] == [0, 1] and [c.text for c in batch.choices] == [only1, only2]
    assert batch.usage.prompt_tokens == soft_prompt.shape[0] + 2 and batch.usage.completion_tokens == 10

    mixed = await aclient.completions.create(**{**greedy, "prompt": "This is a prompt",
                                                "extra_body": {"prompt_embeds": e1, "ignore_eos": True}})
    assert [c.text for c in mixed.choices] == [only1, text_only]

    texts, finishes = ["", ""], 0
    stream = await aclient.completions.create(**{**greedy, "prompt": None, "stream": True,
                                                 "extra_body": {"prompt_embeds": [e1, e2], "ignore_eos": True}})
    async for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
        finishes += chunk.choices[0].finish_reason is not None
    assert texts == [only1, only2] and finishes == 2

    strings = await aclient.completions.create(**{**greedy, "prompt": ["This is a prompt", "Once upon"]})
    assert strings.choices[0].text == text_only and len(strings.choices) == 2
