"""vLLM's chat fields over gRPC mean what they mean over HTTP, on real processes: each ChatRequest field that changes
the prompt (continue_final_message, add_special_tokens, documents, reasoning_effort, mm_processor_kwargs) gives the
same prompt token IDs through gRPC Tokenize and Chat as the same request through HTTP /tokenize and
/v1/chat/completions, and the same answer; a bad value is INVALID_ARGUMENT naming the field; and `splice chat`'s
penalty flags reach the engine (its tokens are the HTTP request's with the same penalties)."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import sys

import grpc
import httpx
import pytest
from transformers import AutoTokenizer

from app.demo import sample_picture
from app.launch import start_stack
from app.tiny import templates
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import API_KEY

BOS_MODEL = "tiny-text-bos"  # its tokenizer adds a BOS (and its template writes one): add_special_tokens shows
N = 8
GREEDY = {"temperature": 0.0, "max_tokens": N, "ignore_eos": True}
HI = [{"role": "user", "content": "Tell me about colours."}]
PREFILL = [{"role": "user", "content": "What is the answer?"}, {"role": "assistant", "content": "The answer is"}]
DOCS = [{"title": "Moon", "text": "The moon is made of rock."}]
# ChatML with the documents and the reasoning effort printed, as RAG / reasoning templates do.
DOC_TEMPLATE = ("{% if documents %}{% for d in documents %}{{ d.title }}: {{ d.text }}\n{% endfor %}{% endif %}"
                "{% if reasoning_effort is defined %}effort={{ reasoning_effort }} thinking={{ enable_thinking }}\n"
                "{% endif %}" + templates.CHATML)


@pytest.fixture(scope="module")
def bos_stack(tiny_dirs):
    engine, pre = start_stack(BOS_MODEL, http_port=0, preprocessor_args=["--trust-request-chat-template"])
    yield pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def bos_faces(bos_stack):
    with SpliceClient(bos_stack.address, timeout=120) as rpc, \
            httpx.Client(base_url=f"http://{bos_stack.http_address}", timeout=120) as http:
        yield rpc, http


@pytest.fixture(scope="module")
def vision_faces(http_stack):
    """tiny-idefics3 (the shared HTTP stack): its processor takes do_image_splitting."""
    with SpliceClient(http_stack[1].address, timeout=120, api_key=API_KEY) as rpc, \
            httpx.Client(base_url=f"http://{http_stack[1].http_address}", timeout=120,
                         headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        yield rpc, http


def _same_on_both_faces(faces, messages, http_messages=None, **fields) -> tuple[list[int], str]:
    """(the prompt's token IDs, its rendered text): gRPC Tokenize's, which must equal HTTP /tokenize's and the HTTP
    chat's prompt_token_ids; the gRPC Chat's answer must equal the HTTP chat's, token for token."""
    rpc, http = faces
    http_messages = http_messages or messages
    tokenized = rpc.tokenize(messages, **fields)
    ids = list(tokenized.token_ids)
    r = http.post("/tokenize", json={"messages": http_messages, **fields})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == ids
    chunks = list(rpc.chat(messages, **fields, **GREEDY))
    r = http.post("/v1/chat/completions", json={"messages": http_messages, **fields, **GREEDY,
                                                "return_token_ids": True})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["prompt_token_ids"] == ids
    assert reply["choices"][0]["token_ids"] == [t for c in chunks for t in c.token_ids]
    assert chunks[-1].usage.prompt_tokens == reply["usage"]["prompt_tokens"] == len(ids)
    return ids, tokenized.prompt


def test_continue_final_message(bos_faces, tiny_dirs):
    closed, _ = _same_on_both_faces(bos_faces, PREFILL, add_generation_prompt=False)
    open_, _ = _same_on_both_faces(bos_faces, PREFILL, add_generation_prompt=False, continue_final_message=True)
    hf = AutoTokenizer.from_pretrained(tiny_dirs[BOS_MODEL])
    assert open_ == hf.apply_chat_template(PREFILL, continue_final_message=True, add_generation_prompt=False,
                                           tokenize=True, return_dict=True)["input_ids"]
    assert open_ != closed and hf.decode(open_).endswith("The answer is")


def test_add_special_tokens(bos_faces, tiny_dirs):
    plain, _ = _same_on_both_faces(bos_faces, HI)
    doubled, _ = _same_on_both_faces(bos_faces, HI, add_special_tokens=True)
    bos = AutoTokenizer.from_pretrained(tiny_dirs[BOS_MODEL]).bos_token_id
    assert plain[0] == bos and doubled == [bos, *plain]  # vLLM's: on top of the template's own


def test_documents_and_reasoning_effort(bos_faces):
    plain, plain_text = _same_on_both_faces(bos_faces, HI, chat_template=DOC_TEMPLATE)
    ids, text = _same_on_both_faces(bos_faces, HI, chat_template=DOC_TEMPLATE, documents=DOCS, reasoning_effort="low")
    assert text == "Moon: The moon is made of rock.\neffort=low thinking=True\n" + plain_text and ids != plain
    # "none" turns thinking off unless chat_template_kwargs says otherwise; the request's fields win over its
    _, text = _same_on_both_faces(bos_faces, HI, chat_template=DOC_TEMPLATE, reasoning_effort="none",
                                  chat_template_kwargs={"documents": [{"title": "Old", "text": "x"}]})
    assert text == "Old: x\neffort=none thinking=False\n" + plain_text


def test_mm_processor_kwargs(vision_faces):
    png = io.BytesIO()
    sample_picture(120, 80).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    rpc_messages = [{"role": "user", "content": [{"type": "image", "image": png.getvalue()}, "What is it?"]}]
    http_messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": "What is it?"}]}]
    image_token = vision_faces[0].model_info().image_token_id
    split, _ = _same_on_both_faces(vision_faces, rpc_messages, http_messages)
    whole, _ = _same_on_both_faces(vision_faces, rpc_messages, http_messages,
                                   mm_processor_kwargs={"do_image_splitting": False})
    assert 0 < whole.count(image_token) < split.count(image_token)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"documents": [{"title": 3}]}, "documents[0].title must be a string"),
    ({"documents": [{"title": "x", "text": ["a"]}]}, "documents[0].text must be a string"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort must be one of"),
    ({"continue_final_message": True}, "continue_final_message and add_generation_prompt"),
    ({"mm_processor_kwargs": {"max_pixels": 1024}}, "mm_processor_kwargs ['max_pixels'] are not served"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "add_generation_prompt"),
])
def test_a_bad_value_is_invalid_argument_naming_the_field(bos_faces, fields, needle):
    rpc, _ = bos_faces
    for call in (lambda: rpc.tokenize(HI, **fields), lambda: list(rpc.chat(HI, **fields, **GREEDY))):
        with pytest.raises(SpliceClientError) as err:
            call()
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and needle in err.value.details, err.value
    assert rpc.tokenize(HI).token_ids  # still serving


def test_splice_chat_penalty_flags_reach_the_engine(bos_stack, bos_faces):
    """`splice chat --logprobs` prints each answer token's ID: they are the HTTP request's with the same
    penalties, and not the answer without them."""
    _, http = bos_faces
    penalties = {"repetition_penalty": 1.6, "frequency_penalty": 1.0, "presence_penalty": 0.5}
    content = [{"type": "text", "text": HI[0]["content"]}]  # (splice chat sends its prompt as a text part)

    def over_http(**controls) -> tuple[list[int], str]:
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], **GREEDY,
                                                    **controls, "return_token_ids": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"], r.json()["choices"][0]["message"]["content"]

    out = subprocess.run([sys.executable, "-m", "app.cli", "chat", HI[0]["content"], "--target", bos_stack.address,
                          "--max-tokens", str(N), "--ignore-eos", "--logprobs", "--repetition-penalty", "1.6",
                          "--frequency-penalty", "1", "--presence-penalty", "0.5"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tokens = [int(t) for t in re.findall(r"^token (\d+)", out.stderr, re.MULTILINE)]
    penalized, text = over_http(**penalties)
    assert tokens == penalized and out.stdout == text + "\n"
    assert penalized != over_http()[0]  # (the penalties change this answer: the flags are what made it)
