"""On a model whose tokenizer adds a BOS (tiny-text-bos, as Llama 3 and Gemma), a completions text prompt is
served as HF's generate serves the BOS-prefixed IDs, through the openai SDK and the gRPC client alike."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.launch import start_stack
from clients import SpliceClient

MODEL = "tiny-text-bos"
TEXT = "Once upon a time"
N = 6


@pytest.fixture(scope="module")
def bos_stack(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0)
    yield pre
    pre.stop()
    engine.stop()


def test_completions_text_is_generated_from_the_bos_prefixed_ids(tiny_dirs, bos_stack):
    tok = AutoTokenizer.from_pretrained(tiny_dirs[MODEL])
    ids = tok(TEXT)["input_ids"]
    assert ids[0] == tok.bos_token_id
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[MODEL]).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
    hf = out[0, len(ids):].tolist()

    greedy = dict(temperature=0.0, max_tokens=N, ignore_eos=True)
    with SpliceClient(bos_stack.address, timeout=120) as client:
        chunks = list(client.complete([TEXT], **greedy))
        assert [t for c in chunks for t in c.token_ids] == hf
        assert chunks[-1].usage.prompt_tokens == len(ids)
        assert client.tokenize(text=TEXT).token_ids == tuple(ids)
        text = client.detokenize(hf)

    with openai.OpenAI(base_url=f"http://{bos_stack.http_address}/v1", api_key="unused", max_retries=0) as sdk:
        reply = sdk.completions.create(model=MODEL, prompt=TEXT, temperature=0, max_tokens=N,
                                       extra_body={"ignore_eos": True})
    assert reply.choices[0].text == text and reply.usage.prompt_tokens == len(ids)
