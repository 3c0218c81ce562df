"""prompt_logprobs, completions echo and logprob_token_ids end to end: through the official `openai` SDK against real
processes, in vLLM's shapes, the same values as the gRPC client's, the prompt's equal to HF's log_softmax, and every
value vLLM refuses a 400 naming the field."""

from __future__ import annotations

import base64
import io

import grpc
import openai
import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer

from app.demo import embedding_rows, sample_picture
from clients import SpliceClientError
from tests.integration.conftest import MODEL

PROMPT = "Once upon a time there was a cat"


@pytest.fixture(scope="module")
def tok(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _text(tok, token_id: int) -> str:
    return tok.decode([token_id])


def _torch_b64(tensor: torch.Tensor) -> str:
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return base64.b64encode(buf.getvalue()).decode()


def test_completions_prompt_logprobs_in_vllms_shape_equal_hf_and_grpc(client, grpc_client, tok, model_dir):
    done = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=2,
                                     extra_body={"prompt_logprobs": 3, "return_token_ids": True})
    choice = done.choices[0]
    ids = choice.prompt_token_ids
    plp = choice.prompt_logprobs
    assert len(plp) == len(ids) == done.usage.prompt_tokens and plp[0] is None
    with torch.inference_mode():  # HF's own forward on the same IDs
        model = AutoModelForImageTextToText.from_pretrained(model_dir)
        want = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    for p in range(1, len(ids)):
        position = plp[p]
        keys = list(position)
        assert keys[0] == str(ids[p]) and len(position) in (3, 4)  # the prompt's token first, then the 3 most likely
        mine = position[str(ids[p])]
        assert mine["logprob"] == pytest.approx(float(want[p - 1, ids[p]]), abs=2e-4)
        assert mine["rank"] == int((want[p - 1] >= want[p - 1, ids[p]]).sum())
        assert mine["decoded_token"] == _text(tok, ids[p])
        tops = [position[k] for k in keys[1:]] if len(position) == 4 else \
            sorted(position.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in tops] == [1, 2, 3]
        assert [e["logprob"] for e in tops] == pytest.approx(want[p - 1].topk(3).values.tolist(), abs=2e-4)
    chunks = list(grpc_client.complete([PROMPT], temperature=0.0, max_tokens=2, prompt_logprobs=3))
    got = chunks[0].prompt_logprobs
    assert got.token_ids == tuple(ids) and all(c.prompt_logprobs is None for c in chunks[1:])
    assert [e[1] for e in got.entries()[1:]] == pytest.approx([plp[p][str(ids[p])]["logprob"]
                                                                for p in range(1, len(ids))])
    plain = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=2)
    assert plain.choices[0].prompt_logprobs is None and plain.choices[0].text == choice.text


def test_chat_prompt_logprobs_with_an_image_on_the_response(client, grpc_client):
    buf = io.BytesIO()
    sample_picture(80, 40).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is shown?"}]}]
    reply = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=3,
                                           extra_body={"prompt_logprobs": 0})
    plp = reply.prompt_logprobs  # vLLM's: on the response
    assert len(plp) == reply.usage.prompt_tokens and plp[0] is None
    assert all(len(p) == 1 and next(iter(p.values()))["logprob"] <= 0 for p in plp[1:])
    grpc_msgs = [{"role": "user", "content": [{"type": "image", "image": sample_picture(80, 40)},
                                              {"type": "text", "text": "What is shown?"}]}]
    chunks = list(grpc_client.chat(grpc_msgs, temperature=0.0, max_tokens=3, prompt_logprobs=0))
    entries = chunks[0].prompt_logprobs.entries()
    assert [str(e[0]) for e in entries[1:]] == [next(iter(p)) for p in plp[1:]]
    assert [e[1] for e in entries[1:]] == pytest.approx([next(iter(p.values()))["logprob"] for p in plp[1:]])
    plain = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=3)
    assert plain.prompt_logprobs is None and plain.choices[0].message.content == reply.choices[0].message.content


def test_echo_puts_the_prompt_and_its_logprobs_first(client, tok):
    base = dict(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=2,
                extra_body={"ignore_eos": True, "return_token_ids": False})
    plain = client.completions.create(**base)
    echoed = client.completions.create(echo=True, **base)
    choice = echoed.choices[0]
    assert choice.text == PROMPT + plain.choices[0].text
    lp = choice.logprobs
    n = echoed.usage.prompt_tokens
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert len(ids) == n and lp.tokens[:n] == [_text(tok, t) for t in ids]
    assert lp.tokens[n:] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.token_logprobs[n:] == pytest.approx(plain.choices[0].logprobs.token_logprobs)
    assert all(len(t) <= 3 and lp.tokens[i] in t for i, t in enumerate(lp.top_logprobs) if t is not None)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # the prompt's logprobs (implied by echo with logprobs: `logprobs` alternatives) come back as prompt_logprobs too
    assert [p and p[str(t)]["logprob"] for p, t in zip(choice.prompt_logprobs, ids, strict=True)] == \
        pytest.approx([None, *lp.token_logprobs[1:n]])

    stream = list(client.completions.create(echo=True, stream=True, **base))
    assert stream[0].choices[0].text.startswith(PROMPT)  # the prompt in the first chunk, as vLLM's
    assert "".join(c.choices[0].text for c in stream) == choice.text
    assert [t for c in stream for t in c.choices[0].logprobs.tokens] == lp.tokens
    assert [o for c in stream for o in c.choices[0].logprobs.text_offset] == lp.text_offset

    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert only.choices[0].text == PROMPT and only.choices[0].logprobs.tokens == lp.tokens[:n]
    assert only.choices[0].finish_reason == "length" and only.usage.completion_tokens == 1  # vLLM's: one generated
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True, temperature=0)
    assert by_ids.choices[0].text.startswith(tok.decode(ids))
    text_only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, temperature=0)
    assert text_only.choices[0].logprobs is None and text_only.choices[0].prompt_logprobs is None


def test_logprob_token_ids_return_exactly_those_tokens(client, grpc_client, tok):
    listed = [tok(w, add_special_tokens=False)["input_ids"][0] for w in (" a", " the", " cat")]
    assert len(set(listed)) == 3
    completion = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=3, logprobs=1,
                                           extra_body={"logprob_token_ids": listed, "ignore_eos": True})
    lp = completion.choices[0].logprobs
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert next(iter(top)) == token and set(top) == {token, *(_text(tok, t) for t in listed)}
    chunks = list(grpc_client.complete([PROMPT], temperature=0.0, max_tokens=3, logprobs=True,
                                       logprob_token_ids=listed, ignore_eos=True))
    per_token = [t for c in chunks for t in c.top_logprobs]
    assert [[i for i, _ in t] for t in per_token] == [listed] * 3
    assert [top[_text(tok, listed[2])] for top in lp.top_logprobs] == pytest.approx([t[2][1] for t in per_token])
    msgs = [{"role": "user", "content": "Tell me about cats."}]
    chat = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=3, logprobs=True,
                                          top_logprobs=5, extra_body={"logprob_token_ids": listed, "ignore_eos": True})
    for content in chat.choices[0].logprobs.content:
        shown = [t.token for t in content.top_logprobs]
        assert shown[0] == content.token and set(shown[1:]) <= {_text(tok, t) for t in listed}
        assert len(shown) == len({content.token, *(_text(tok, t) for t in listed)})


def test_refusals_name_the_field(client, grpc_client, model_dir):
    msgs = [{"role": "user", "content": "Hi"}]
    soft = _torch_b64(embedding_rows(model_dir, [5, 6, 7]))
    cases = [
        (dict(prompt=PROMPT, extra_body={"prompt_logprobs": 21}), "prompt_logprobs"),
        (dict(prompt=PROMPT, extra_body={"prompt_logprobs": -1}), "prompt_logprobs"),
        (dict(prompt=PROMPT, stream=True, extra_body={"prompt_logprobs": 2}), "prompt_logprobs"),
        (dict(prompt="", extra_body={"prompt_embeds": soft, "prompt_logprobs": 0}), "prompt_logprobs"),
        (dict(prompt="", echo=True, extra_body={"prompt_embeds": soft}), "echo"),
        (dict(prompt=PROMPT, extra_body={"logprob_token_ids": [1]}), "logprob_token_ids"),
        (dict(prompt=PROMPT, logprobs=1, extra_body={"logprob_token_ids": list(range(129))}), "logprob_token_ids"),
        (dict(prompt=PROMPT, logprobs=1, extra_body={"logprob_token_ids": [10 ** 6]}), "logprob_token_ids"),
        (dict(prompt=PROMPT, logprobs=1, echo=True, max_tokens=0, extra_body={"logprob_token_ids": [1]}),
         "logprob_token_ids"),
        (dict(prompt=PROMPT, max_tokens=0), "max_tokens"),
    ]
    for kwargs, field in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model=MODEL, **{"max_tokens": 2, **kwargs})
        assert bad.value.status_code == 400 and field in bad.value.message, (kwargs, bad.value.message)
    embeds_chat = [{"role": "user", "content": [{"type": "prompt_embeds", "data": soft},
                                                {"type": "text", "text": "Continue."}]}]
    for kwargs, field in [(dict(messages=embeds_chat, extra_body={"prompt_logprobs": 1}), "prompt_logprobs"),
                          (dict(messages=msgs, extra_body={"logprob_token_ids": [1]}), "logprob_token_ids"),
                          (dict(messages=msgs, stream=True, extra_body={"prompt_logprobs": 1}), "prompt_logprobs")]:
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model=MODEL, max_tokens=2, **kwargs)
        assert field in bad.value.message, (kwargs, bad.value.message)
    with pytest.raises(SpliceClientError) as refused:  # gRPC: INVALID_ARGUMENT, the same rule
        list(grpc_client.complete([embedding_rows(model_dir, [5, 6])], max_tokens=2, prompt_logprobs=0))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "prompt_logprobs" in refused.value.details
    with pytest.raises(SpliceClientError) as refused:
        list(grpc_client.complete([PROMPT], max_tokens=2, prompt_logprobs=21))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "prompt_logprobs" in refused.value.details
    # what vLLM accepts: prompt_logprobs 0 while streaming (nothing to return), echo's implied prompt logprobs
    # skipped for a conversation with prompt embeddings (it has no tokens to score)
    assert list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
                                          extra_body={"prompt_logprobs": 0}))
    echoed = client.chat.completions.create(model=MODEL, messages=embeds_chat, max_tokens=2, extra_body={"echo": True})
    assert echoed.prompt_logprobs is None
