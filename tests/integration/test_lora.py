"""LoRA adapters through both services, as a vLLM user calls them (`splice up`'s flags: --enable-lora, --lora-modules
NAME=PATH, --max-loras, --max-cpu-loras, --allow-runtime-lora-updating), against HF + PEFT's own generate on the same
base and adapter:

- tiny-text and tiny-llava (whose adapter adapts the vision tower and the connector too): greedy tokens under the
  base and each adapter over gRPC equal HF + PEFT's on the same prompt IDs, with text, with a picture, and with the
  text's rows as prompt embeddings; the HTTP face (`model: NAME`) answers the same text;
- the base and two adapters (and pictures) in flight together over HTTP each get their solo answer;
- /v1/models lists each adapter with `parent` the base; an unknown name is vLLM's 404; the runtime load and unload
  routes exist only behind the switch and need the API key.
"""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch

from app.demo import embedding_rows, vllm_base64
from app.launch import start_stack
from app.loras import ensure_lora
from clients import SpliceClient
from clients.errors import SpliceClientError
from tests.engine.engine_factories import picture
from tests.engine.family_cases import FamilyCase

N = 8
KEY = "lora-test-key"


def _serve(model: str, *pre_args: str):
    engine, pre = start_stack(model, http_port=0, engine_args=[
        "--enable-lora", "--lora-modules", f"{model}-lora={model}-lora", f"{model}-lora2={model}-lora2",
        "--max-loras", "2", "--max-cpu-loras", "2"], preprocessor_args=list(pre_args))
    return engine, pre


@pytest.fixture(scope="module")
def text_stack(tiny_dirs):
    engine, pre = _serve("tiny-text", "--allow-runtime-lora-updating", "--api-key", KEY)
    yield pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def llava_stack(tiny_dirs):
    engine, pre = _serve("tiny-llava")
    yield pre
    pre.stop()
    engine.stop()


def _hf(folder, lora: str):
    import transformers
    from peft import PeftModel

    arch = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    model = getattr(transformers, arch).from_pretrained(folder, dtype=torch.float32).eval()
    return PeftModel.from_pretrained(model, str(ensure_lora(lora))).eval() if lora else model


def _grpc(pre, messages, lora: str, key: str | None = None) -> tuple[list[int], str]:
    with SpliceClient(pre.address, timeout=120, api_key=key) as client:
        chunks = list(client.chat(messages, lora=lora, temperature=0.0, max_tokens=N))
    return [t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks)


def _http(pre, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key=key or "none", max_retries=0, timeout=120)


def _png(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_text_and_prompt_embeds_equal_hf_peft_over_grpc_and_http(text_stack, tiny_dirs):
    folder = tiny_dirs["tiny-text"]
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    with SpliceClient(text_stack.address, timeout=60, api_key=KEY) as client:
        ids = client.tokenize(messages).token_ids
    text_ids = list(ids)
    rows = embedding_rows(folder, text_ids)  # the whole prompt's rows, sent as prompt embeddings
    answers = set()
    for lora in ("", "tiny-text-lora", "tiny-text-lora2"):
        want = FamilyCase("tiny-text", images=False).hf_generate(_hf(folder, lora), text_ids, {}, N)
        got, text = _grpc(text_stack, messages, lora, KEY)
        assert got == want, lora
        http = _http(text_stack, KEY).chat.completions.create(model=lora or "tiny-text", messages=messages,
                                                               temperature=0.0, max_tokens=N)
        assert http.choices[0].message.content == text and http.model == (lora or "tiny-text")
        embeds = _http(text_stack, KEY).completions.create(model=lora or "tiny-text", prompt=None, temperature=0.0,
                                                           max_tokens=N,
                                                           extra_body={"prompt_embeds": vllm_base64(rows)})
        with SpliceClient(text_stack.address, timeout=60, api_key=KEY) as client:
            as_rows = [t for c in client.complete([rows], lora=lora, temperature=0.0, max_tokens=N)
                       for t in c.token_ids]
        assert as_rows == want, lora
        assert embeds.choices[0].text == text, lora  # the same tokens, detokenized alike
        answers.add(tuple(got))
    assert len(answers) == 3


def test_a_picture_under_a_tower_adapter_equals_hf_peft(llava_stack, tiny_dirs):
    folder = tiny_dirs["tiny-llava"]
    case = FamilyCase("tiny-llava")
    ids, tensors = case.inputs(folder, "What is shown?", images=1, shift=0)
    pic = picture(*case.picture_size, shift=0)
    messages = [{"role": "user", "content": [pic, "What is shown?"]}]
    for lora in ("", "tiny-llava-lora", "tiny-llava-lora2"):
        got, text = _grpc(llava_stack, messages, lora)
        assert got == case.hf_generate(_hf(folder, lora), ids, tensors, N), lora
        http = _http(llava_stack).chat.completions.create(
            model=lora or "tiny-llava", temperature=0.0, max_tokens=N,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png(pic)}},
                                                    {"type": "text", "text": "What is shown?"}]}])
        assert http.choices[0].message.content == text, lora


def test_base_and_two_adapters_in_flight_together_get_their_solo_answers(llava_stack):
    def ask(k: int) -> str:
        lora = ("", "tiny-llava-lora", "tiny-llava-lora2")[k % 3]
        content = [{"type": "text", "text": "word " * (2 + k)}]
        if k % 2 == 0:
            content.insert(0, {"type": "image_url", "image_url": {"url": _png(picture(60, 40, shift=k))}})
        out = _http(llava_stack).chat.completions.create(model=lora or "tiny-llava", temperature=0.0,
                                                          max_tokens=4 + k, messages=[{"role": "user",
                                                                                       "content": content}])
        return out.choices[0].message.content

    solo = [ask(k) for k in range(9)]
    with ThreadPoolExecutor(9) as pool:
        assert list(pool.map(ask, range(9))) == solo


def test_models_list_adapters_and_unknown_names_are_vllms_404(text_stack, llava_stack):
    listed = _http(llava_stack).models.list().data
    assert [m.id for m in listed] == ["tiny-llava", "tiny-llava-lora", "tiny-llava-lora2"]
    assert [getattr(m, "parent", None) for m in listed] == [None, "tiny-llava", "tiny-llava"]
    with pytest.raises(openai.NotFoundError, match="The model `nosuch` does not exist"):
        _http(llava_stack).chat.completions.create(model="nosuch", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(SpliceClientError, match="does not exist") as err:
        _grpc(llava_stack, [{"role": "user", "content": "hi"}], "nosuch")
    assert err.value.code.name == "NOT_FOUND"
    # the switch is off on this stack: the routes do not exist
    r = httpx.post(f"http://{llava_stack.http_address}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "y"})
    assert r.status_code == 404


def test_load_and_unload_at_run_time(text_stack):
    base = f"http://{text_stack.http_address}/v1"
    auth = {"authorization": f"Bearer {KEY}"}
    body = {"lora_name": "late", "lora_path": str(ensure_lora("tiny-text-lora"))}
    assert httpx.post(f"{base}/load_lora_adapter", json=body).status_code == 401  # the API key guards them
    r = httpx.post(f"{base}/load_lora_adapter", json=body, headers=auth, timeout=60)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' added successfully."
    assert "late" in [m.id for m in _http(text_stack, KEY).models.list().data]
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    assert _grpc(text_stack, messages, "late", KEY) == _grpc(text_stack, messages, "tiny-text-lora", KEY)
    again = httpx.post(f"{base}/load_lora_adapter", json=body, headers=auth, timeout=60)
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    bad = httpx.post(f"{base}/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nonexistent"},
                     headers=auth, timeout=60)
    assert bad.status_code == 400 and "'bad'" in bad.json()["error"]["message"]
    r = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "late"}, headers=auth, timeout=60)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' removed successfully."
    gone = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "late"}, headers=auth, timeout=60)
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        _http(text_stack, KEY).chat.completions.create(model="late", messages=messages)
