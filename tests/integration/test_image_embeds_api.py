"""image_embeds through the real services, as a vLLM user sends them: a picture's own features, made by the HF model's
get_image_features on the pixels its HF processor makes, sent with the geometry vLLM names, give the picture's answer,
through the `openai` SDK (the trained default model, Idefics3, and Qwen2-VL) and through gRPC (one message and an
Upload stream); beside prompt embeddings on a model whose sentinels lie past its vocabulary too."""

from __future__ import annotations

import base64
import io
import random

import openai
import pytest
import torch

from app.demo import embedding_rows, sample_picture, vllm_base64
from app.launch import start_stack
from app.tiny import DEFAULT_MODEL, colors
from clients import SpliceClient, image_embeds_part, image_part
from engine.models.base import feature_rows
from preprocessor.model_files import load_model_files

MAX_TOKENS = 8
QUESTION = "What colour is the picture?"
EMBEDS_ON = ["--enable-mm-embeds"]


def _stack(name: str):
    engine, pre = start_stack(name, http_port=0, preprocessor_args=EMBEDS_ON)
    return engine, pre


@pytest.fixture(scope="module")
def idefics3(tiny_dirs):
    engine, pre = _stack(DEFAULT_MODEL)
    yield pre, tiny_dirs[DEFAULT_MODEL]
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def qwen(tiny_dirs):
    engine, pre = _stack("tiny-qwen2-vl")
    yield pre, tiny_dirs["tiny-qwen2-vl"]
    pre.stop()
    engine.stop()


def _openai(pre) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{pre.http_address}/v1", api_key="unused", timeout=120, max_retries=0)


def _data_url(picture) -> str:
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def hf_features(model_dir, picture) -> tuple[torch.Tensor, dict[str, torch.Tensor], object]:
    """(the picture's features [rows, hidden] from the HF model's own vision tower and projector, the HF processor's
    tensors for it, the processor)."""
    import transformers
    from transformers import AutoConfig

    processor = load_model_files(model_dir).processor
    config = AutoConfig.from_pretrained(model_dir)
    model = getattr(transformers, config.architectures[0]).from_pretrained(model_dir).eval()
    prompt = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}])
    tensors = processor(text=prompt, images=[picture], return_tensors="pt")
    inputs = {k: v for k, v in tensors.items() if k in ("pixel_values", "pixel_attention_mask", "image_grid_thw")}
    with torch.inference_mode():
        features = feature_rows(model.get_image_features(**inputs))
    return features, tensors, processor


def _chat(client: openai.OpenAI, image: dict, *before: dict):
    messages = [{"role": "user", "content": [*before, image, {"type": "text", "text": QUESTION}]}]
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS)


def _demo_chat(client: openai.OpenAI, image: dict) -> str:
    """The trained model's demo question around `image`; the answer (greedy)."""
    parts = [{"type": "text", "text": colors.DEMO_PREFACE}, {"type": "text", "text": colors.DEMO_FAVORITE}, image,
             {"type": "text", "text": colors.DEMO_QUESTION}]
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}],
                                            temperature=0, max_tokens=24)
    return answer.choices[0].message.content


def test_idefics3_colors_over_http_as_vllm_sends_them(idefics3):
    """The trained default model names the picture's colour from its features as from its pixels."""
    pre, model_dir = idefics3
    rng = random.Random(11)
    with _openai(pre) as client:
        for color in ("blue", "red"):
            picture = colors.picture(color, rng)
            features, _, processor = hf_features(model_dir, picture)
            tiles = processor.image_processor([picture], return_row_col_info=True)
            rows, cols = tiles["rows"][0][0], tiles["cols"][0][0]
            want = _demo_chat(client, {"type": "image_url", "image_url": {"url": _data_url(picture)}})
            assert colors.read_answer(want) == (color, colors.DEMO_PAIR[1])
            # vLLM's dict form, the geometry as JSON integers and as base64 torch.save tensors
            for geometry in ({"rows": rows, "cols": cols},
                             {"rows": vllm_base64(torch.tensor([rows])), "cols": vllm_base64(torch.tensor([cols]))}):
                part = {"type": "image_embeds", "image_embeds": {"image_embeds": vllm_base64(features), **geometry}}
                assert _demo_chat(client, part) == want
        with pytest.raises(openai.BadRequestError) as bad:  # a row short of the tiles' image tokens
            _chat(client, {"type": "image_embeds", "image_embeds": {
                "image_embeds": vllm_base64(features[:-1]), "rows": rows, "cols": cols}})
    assert bad.value.status_code == 400
    assert f"messages[0].content[0]: image_embeds has {features.shape[0] - 1} rows" in bad.value.message
    assert f"makes {features.shape[0]} image tokens" in bad.value.message


def test_qwen2_vl_over_http_and_grpc(qwen, monkeypatch):
    pre, model_dir = qwen
    picture = sample_picture(90, 60)
    features, tensors, _ = hf_features(model_dir, picture)
    grid = tensors["image_grid_thw"]  # [1, 3]
    with _openai(pre) as client:
        want = _chat(client, {"type": "image_url", "image_url": {"url": _data_url(picture)}}).choices[0].message
        got = _chat(client, {"type": "image_embeds", "image_embeds": {
            "image_embeds": vllm_base64(features), "image_grid_thw": vllm_base64(grid)}}).choices[0].message
        assert got.content == want.content
        with pytest.raises(openai.BadRequestError, match=r"image_embeds needs \['image_grid_thw'\]"):
            _chat(client, {"type": "image_embeds", "image_embeds": vllm_base64(features)})
    with SpliceClient(pre.address, timeout=120) as grpc_client:
        def answer(image) -> str:
            msgs = [{"role": "user", "content": [image, QUESTION]}]
            return "".join(c.text for c in grpc_client.chat(msgs, temperature=0.0, max_tokens=MAX_TOKENS))

        by_picture = answer(image_part(picture))
        assert by_picture == want.content
        assert answer(image_embeds_part(features, image_grid_thw=grid[0].tolist())) == by_picture
        import clients.requests

        monkeypatch.setattr(clients.requests, "UPLOAD_THRESHOLD", 0)  # the features streamed in an Upload
        assert answer(image_embeds_part(features, image_grid_thw=grid[0].tolist())) == by_picture


def test_with_prompt_embeds_on_a_model_whose_sentinels_overflow_its_vocabulary(idefics3):
    pre, model_dir = idefics3
    picture = sample_picture(70, 50)
    features, _, processor = hf_features(model_dir, picture)
    tiles = processor.image_processor([picture], return_row_col_info=True)
    files = load_model_files(model_dir)
    with SpliceClient(pre.address, timeout=60) as grpc_client:
        assert min(files.sentinels.ids) >= grpc_client.model_info().vocab_rows  # past the engine's embedding table
    soft = {"type": "prompt_embeds", "data": vllm_base64(embedding_rows(model_dir, [11, 12, 13, 14]))}
    supplied = {"type": "image_embeds", "image_embeds": {"image_embeds": vllm_base64(features),
                                                         "rows": tiles["rows"][0][0], "cols": tiles["cols"][0][0]}}
    with _openai(pre) as client:
        want = _chat(client, {"type": "image_url", "image_url": {"url": _data_url(picture)}}, soft)
        got = _chat(client, supplied, soft)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
