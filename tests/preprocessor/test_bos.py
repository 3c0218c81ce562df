"""Completions text gets the tokenizer's special tokens by default, as vLLM's does: on a model whose tokenizer
adds a BOS (tiny-text-bos, as Llama 3 and Gemma), a completions prompt reaches the engine with it, HTTP and gRPC
alike and equal to what /tokenize and Tokenize answer; `add_special_tokens: false` leaves it off; token IDs and
prompt embeddings are used as given; a chat prompt holds the template's BOS only, never a second one."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from app.demo import vllm_base64
from clients.requests import complete_request, tokenize_request
from splice.v1 import preprocessor_pb2_grpc
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import rows

MODEL = "tiny-text-bos"
TEXT = "Once upon a time"


@pytest.fixture(scope="module")
def hf_tok(tiny_dirs):
    return AutoTokenizer.from_pretrained(tiny_dirs[MODEL])


def test_the_tiny_tokenizer_adds_a_bos(hf_tok):
    assert hf_tok(TEXT)["input_ids"] == [hf_tok.bos_token_id, *hf_tok(TEXT, add_special_tokens=False)["input_ids"]]


async def test_completions_text_gets_the_bos_over_http_and_grpc(tiny_dirs, tiny, hf_tok):
    with_bos, without = hf_tok(TEXT)["input_ids"], hf_tok(TEXT, add_special_tokens=False)["input_ids"]
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        sent = face.engine.requests

        async def http(**body) -> list[int]:
            r = await face.http.post("/v1/completions", json={"max_tokens": 2, **body})
            assert r.status_code == 200, r.text
            return list(sent[-1].token_ids)

        assert await http(prompt=TEXT) == with_bos
        assert await http(prompt=[TEXT, TEXT]) == with_bos  # each prompt of a batch
        assert await http(prompt=TEXT, add_special_tokens=False) == without
        assert await http(prompt=without) == without  # token IDs: as given
        assert (await face.http.post("/tokenize", json={"prompt": TEXT})).json()["tokens"] == with_bos
        await http(prompt_embeds=vllm_base64(rows(3, tiny[MODEL][1].hidden_size)))
        assert sent[-1].prompt_len == 3  # embeddings: no BOS either

        stub = preprocessor_pb2_grpc.PreprocessorStub(face.channel)

        async def grpc_complete(prompt, **kwargs) -> list[int]:
            _ = [c async for c in stub.Complete(complete_request(prompt, max_tokens=2, **kwargs))]
            return list(sent[-1].token_ids)

        assert await grpc_complete([TEXT]) == with_bos
        assert await grpc_complete([TEXT], add_special_tokens=False) == without
        assert await grpc_complete([without, TEXT]) == without + without  # text after another part: none
        assert await grpc_complete([TEXT, TEXT]) == with_bos + without  # the prompt's start only
        assert list((await stub.Tokenize(tokenize_request(None, text=TEXT))).token_ids) == with_bos
        assert list((await stub.Tokenize(tokenize_request(None, text=TEXT, add_special_tokens=False))).token_ids) \
            == without


async def test_chat_holds_the_templates_bos_only(tiny_dirs, tiny, hf_tok):
    messages = [{"role": "user", "content": "Hi"}]
    hf_ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert hf_ids.count(hf_tok.bos_token_id) == 1
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        r = await face.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert list(face.engine.requests[-1].token_ids) == hf_ids
