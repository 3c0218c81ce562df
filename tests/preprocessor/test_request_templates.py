"""Request chat templates: refused unless trusted (no smuggling through chat_template_kwargs); when trusted,
rendered in killable worker processes within a time budget."""

from __future__ import annotations

import time

import pytest

from preprocessor.core import PreprocessorCore
from preprocessor.template import TRUST_FLAG, request_job
from preprocessor.template_sandbox import TemplateSandbox
from splice.errors import SpliceError
from tests.preprocessor.pp_factories import conversation, trusting_core

SIMPLE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
HOSTILE = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"


def _code(fn) -> tuple[str, str]:
    with pytest.raises(SpliceError) as exc:
        fn()
    return exc.value.code, exc.value.message


def test_untrusted_core_refuses_templates_and_smuggled_ones(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info)
    for conv in (conversation(("user", "x"), chat_template=SIMPLE),
                 conversation(("user", "x"), template_kwargs={"chat_template": SIMPLE})):
        code, message = _code(lambda c=conv: core.normalize_chat(c))
        assert code == "FAILED_PRECONDITION" and TRUST_FLAG in message
    # Ordinary kwargs still reach the model's own template.
    assert core.normalize_chat(conversation(("user", "x"), template_kwargs={"note": "hi"})).prompt


def test_trusted_core_still_refuses_a_template_inside_kwargs(tiny):
    files, info = tiny["tiny-text"]
    code, message = _code(lambda: trusting_core(files, info).normalize_chat(
        conversation(("user", "x"), template_kwargs={"chat_template": SIMPLE})))
    assert code == "INVALID_ARGUMENT" and "chat_template" in message


def test_sandbox_renders_as_apply_chat_template(tiny):
    files, info = tiny["tiny-text"]
    conv = conversation(("user", "hello"), ("assistant", "hi"), chat_template=SIMPLE, template_kwargs={"x": 1})
    prompt = trusting_core(files, info).normalize_chat(conv).prompt
    want = files.tokenizer.apply_chat_template([{"role": "user", "content": "hello"},
                                                {"role": "assistant", "content": "hi"}],
                                               chat_template=SIMPLE, tokenize=False, add_generation_prompt=True, x=1)
    assert prompt == want


def test_hostile_template_is_killed_at_its_deadline_and_the_worker_replaced(tiny):
    files, _ = tiny["tiny-text"]
    sandbox = TemplateSandbox(workers=1, timeout=1.0)
    try:
        job = request_job(files.tokenizer, conversation(("user", "x"), chat_template=HOSTILE), None, files.sentinels)
        sandbox.render(request_job(files.tokenizer, conversation(("user", "x"), chat_template=SIMPLE), None,
                                   files.sentinels))  # the worker is up: timing below is the render's alone
        began = time.monotonic()
        code, message = _code(lambda: sandbox.render(job))
        took = time.monotonic() - began
        assert code == "INVALID_ARGUMENT" and "did not render within 1 s" in message
        assert took < 3.0, took
        bomb = "{% set s = 'x' * 2000000000 %}{{ s | length }}"
        code, message = _code(lambda: sandbox.render(request_job(
            files.tokenizer, conversation(("user", "x"), chat_template=bomb), None, files.sentinels)))
        assert code == "INVALID_ARGUMENT" and "MemoryError" in message
        ok = sandbox.render(request_job(files.tokenizer, conversation(("user", "x"), chat_template=SIMPLE), None,
                                        files.sentinels))
        assert ok == "user: x\n"
    finally:
        sandbox.close()
    code, _ = _code(lambda: sandbox.render(job))
    assert code == "UNAVAILABLE"
