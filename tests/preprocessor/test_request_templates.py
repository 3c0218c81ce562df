"""Request chat templates: refused unless trusted (no smuggling through chat_template_kwargs); when trusted,
rendered in killable worker processes within a time budget."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from preprocessor import template_sandbox
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
                                   files.sentinels))  # the worker is up
        # Answered at its deadline (the refusal names it), not when the loop would end: it never does.
        code, message = _code(lambda: sandbox.render(job))
        assert code == "INVALID_ARGUMENT" and "did not render within 1 s" in message
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


def _job(files, template: str):
    return request_job(files.tokenizer, conversation(("user", "x"), chat_template=template), None, files.sentinels)


def test_a_killed_worker_is_replaced_at_once_by_a_spare_already_started(tiny):
    """A looping template's worker is killed; the next render runs on the spare that was already warm, not on a
    process started after the kill (whose imports would eat the next renders' budgets)."""
    files, _ = tiny["tiny-text"]
    sandbox = TemplateSandbox(workers=1, timeout=1.0, spares=1)
    try:
        assert sandbox.wait_warm(120)
        (killed,), (spare,) = sandbox.processes()["driving"], sandbox.processes()["spare"]
        code, message = _code(lambda: sandbox.render(_job(files, HOSTILE)))
        assert code == "INVALID_ARGUMENT" and "did not render within 1 s" in message
        assert sandbox.render(_job(files, SIMPLE)) == "user: x\n"
        assert sandbox.processes()["driving"] == [spare]  # the spare rendered it
        assert not Path(f"/proc/{killed}").exists()  # killed and reaped
        assert sandbox.wait_warm(120)  # and a successor became the new spare
        assert sandbox.processes()["spare"] not in ([killed], [spare])
    finally:
        sandbox.close()


def test_a_render_no_worker_can_take_in_time_is_refused_not_kept_for_a_restart(tiny, monkeypatch):
    """One worker, no spare: a looping template holds it, a good template queues behind it. When the looper is
    killed at its deadline, the queued render's budget is spent too: it is refused RESOURCE_EXHAUSTED then, while
    the replacement is still starting (held here until the refusal), not rendered seconds later once one is up."""
    files, _ = tiny["tiny-text"]
    sandbox = TemplateSandbox(workers=1, timeout=2.0, spares=0)
    released = threading.Event()
    try:
        assert sandbox.wait_warm(120)
        start_up = template_sandbox._Worker.wait_ready

        def held_start_up(worker) -> None:
            released.wait(120)
            start_up(worker)

        monkeypatch.setattr(template_sandbox._Worker, "wait_ready", held_start_up)

        async def both():  # submitted in this order: the looper takes the worker, the good one queues
            return await asyncio.gather(sandbox.render_async(_job(files, HOSTILE)),
                                        sandbox.render_async(_job(files, SIMPLE)), return_exceptions=True)

        looper, queued = asyncio.run(both())
        assert looper.code == "INVALID_ARGUMENT" and "did not render within 2 s" in looper.message
        assert queued.code == "RESOURCE_EXHAUSTED" and "--chat-template-timeout" in queued.message
        # Answered first, then the looper's process is retired (the driver thread, right after): wait for that.
        guard = time.monotonic() + 60
        while sandbox.processes()["driving"]:
            assert time.monotonic() < guard, sandbox.processes()
            time.sleep(0.01)
        assert not released.is_set() and not sandbox.processes()["spare"]  # its replacement is still held
        released.set()
        assert sandbox.wait_warm(120)
        assert sandbox.render(_job(files, SIMPLE)) == "user: x\n"
    finally:
        released.set()
        sandbox.close()


def test_workers_get_no_secrets(tiny, monkeypatch):
    """The keys (and anything else exported) stay out of a worker's environment: a template is caller code."""
    files, _ = tiny["tiny-text"]
    secrets = {"SPLICE_API_KEY": "public-secret", "SPLICE_ENGINE_API_KEY": "engine-secret", "HF_TOKEN": "hf-secret"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    sandbox = TemplateSandbox(workers=1, timeout=2.0, spares=1)
    try:
        assert sandbox.wait_warm(120)
        assert sandbox.render(_job(files, "{{ messages[0]['content'] }}")) == "x"
        pids = sandbox.processes()["driving"] + sandbox.processes()["spare"]
        assert len(pids) == 2
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
            assert not names & secrets.keys() and "PATH" in names, names
            assert not any(value.encode() in environ for value in secrets.values())
    finally:
        sandbox.close()
