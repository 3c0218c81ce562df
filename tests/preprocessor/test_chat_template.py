"""Template rendering matches the model's own apply_chat_template; content format is auto-detected."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from app.tiny import templates
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_processor
from preprocessor.sentinel import SENTINEL_PREFIX, Sentinels
from preprocessor.template import OPENAI, STRING, content_format
from splice.errors import SpliceError
from tests.preprocessor.pp_factories import conversation, trusting_core

STRING_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}[assistant]{% endif %}{{ suffix | default('') }}")


def test_content_format_detection():
    assert content_format(templates.CHATML) == OPENAI
    assert content_format(templates.LLAVA) == OPENAI
    assert content_format(templates.IDEFICS3) == OPENAI
    assert content_format(templates.GEMMA4) == OPENAI
    assert content_format(templates.QWEN3_5) == OPENAI
    assert content_format(templates.LFM2_VL) == OPENAI
    assert content_format(templates.LLAVA_ONEVISION) == OPENAI
    assert content_format(templates.SMOLVLM) == OPENAI
    assert content_format(STRING_TEMPLATE) == STRING
    aliased = "{% for m in messages %}{% set c = m.content %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}"
    assert content_format(aliased) == OPENAI


TURNS = [("system", "You are terse."), ("user", "Hi there"), ("assistant", "Hello."), ("user", "What is 2+2?")]


@pytest.mark.parametrize("name", ["tiny-text", "tiny-llava", "tiny-idefics3", "tiny-gemma3", "tiny-gemma4",
                                  "tiny-qwen2-vl", "tiny-qwen3.5", "tiny-lfm2-vl", "tiny-llava-onevision",
                                  "tiny-smolvlm", "tiny-nemotron-omni"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("as_string", [True, False])
def test_multi_turn_matches_hf(tiny, tiny_dirs, name, add_generation_prompt, as_string):
    files, info = tiny[name]
    if as_string:
        conv = conversation(*TURNS, add_generation_prompt=add_generation_prompt)
    else:
        conv = conversation(*[(r, [t]) for r, t in TURNS], add_generation_prompt=add_generation_prompt)
    norm = PreprocessorCore(files, info).normalize_chat(conv)
    # The model's templates take list content (detected), so HF gets the list form either way.
    messages = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in TURNS]
    if name == "tiny-text":
        tok = AutoTokenizer.from_pretrained(tiny_dirs[name])
        expected_prompt = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False)
        expected_ids = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)["input_ids"]
    else:
        proc = load_processor(tiny_dirs[name])
        expected_prompt = proc.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        expected_ids = proc(text=expected_prompt, return_tensors="pt")["input_ids"][0].tolist()
    assert norm.prompt == expected_prompt
    assert norm.request.token_ids == expected_ids


def test_template_override_and_kwargs_string_format(tiny):
    files, info = tiny["tiny-text"]
    conv = conversation(("user", ["one", "two"]), chat_template=STRING_TEMPLATE, template_kwargs={"suffix": "!"})
    norm = trusting_core(files, info).normalize_chat(conv)
    expected = AutoTokenizer.from_pretrained(files.path).apply_chat_template(
        [{"role": "user", "content": "one\ntwo"}], chat_template=STRING_TEMPLATE, add_generation_prompt=True,
        tokenize=False, suffix="!")
    assert norm.prompt == expected


def test_string_template_places_one_sentinel_per_embeds_part(tiny):
    from tests.preprocessor.pp_factories import rows

    files, info = tiny["tiny-text"]
    conv = conversation(("user", ["a", rows(2, info.hidden_size), "b"]), chat_template=STRING_TEMPLATE)
    norm = trusting_core(files, info).normalize_chat(conv)
    assert norm.prompt.count(Sentinels.text(0)) == 1 and norm.prompt.count(SENTINEL_PREFIX) == 1
    assert norm.request.embed_spans[0].length == 2


def _reject(core, conv, code="INVALID_ARGUMENT") -> str:
    with pytest.raises(SpliceError) as exc:
        core.normalize_chat(conv)
    assert exc.value.code == code
    return exc.value.message


def test_template_errors_are_invalid_argument(tiny):
    files, info = tiny["tiny-text"]
    core = trusting_core(files, info)
    raising = "{{ raise_exception('roles must alternate') }}"
    assert "roles must alternate" in _reject(core, conversation(("user", "x"), chat_template=raising))
    assert "syntax error" in _reject(core, conversation(("user", "x"), chat_template="{% for %}"))
    assert "may not set" in _reject(core, conversation(("user", "x"), template_kwargs={"tokenize": True}))


def test_template_that_drops_embeds_is_rejected(tiny):
    from tests.preprocessor.pp_factories import rows

    files, info = tiny["tiny-text"]
    drops = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    conv = conversation(("user", ["a", rows(2, info.hidden_size)]), chat_template=drops)
    msg = _reject(trusting_core(files, info), conv)
    assert "rendered prompt_embeds part (message 0, part 1) 0 times" in msg


def test_no_template_is_failed_precondition(tiny, monkeypatch):
    from dataclasses import replace

    files, info = tiny["tiny-text"]
    core = PreprocessorCore(replace(files, chat_template=None), info)
    assert "no chat template" in _reject(core, conversation(("user", "x")), code="FAILED_PRECONDITION")
