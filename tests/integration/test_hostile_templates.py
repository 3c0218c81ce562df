"""The issue's reproducer: request templates that would run for hours, abandoned by their clients, must not
stall the preprocessor (later Chat and Detokenize answer, health stays SERVING, SIGTERM ends it)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.launch import start_stack
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL

HOSTILE = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
HI = [{"role": "user", "content": "Hi"}]


def test_request_templates_are_refused_by_default(stack):
    _, pre = stack
    with SpliceClient(pre.address, timeout=60) as client:
        for kwargs in ({"chat_template": "{{ 'x' }}"}, {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}):
            with pytest.raises(SpliceClientError) as err:
                list(client.chat(HI, max_tokens=1, **kwargs))
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--trust-request-chat-template" in err.value.details


def test_abandoned_hostile_templates_do_not_stall_the_preprocessor(tiny_dirs):
    engine, pre = start_stack(MODEL, preprocessor_args=["--trust-request-chat-template", "--chat-template-timeout",
                                                        "1", "--chat-template-workers", "2"])
    try:
        codes: list[grpc.StatusCode] = []

        def hostile(i: int) -> None:
            with SpliceClient(pre.address, timeout=1.0 + i % 3) as client:  # abandoned after 1-3 s
                try:
                    list(client.chat(HI, chat_template=HOSTILE, max_tokens=1))
                except SpliceClientError as exc:
                    codes.append(exc.code)

        threads = [threading.Thread(target=hostile, args=(i,)) for i in range(7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(codes) == 7 and all(c != grpc.StatusCode.OK for c in codes), codes

        with SpliceClient(pre.address, timeout=30) as client:
            began = time.monotonic()
            chunks = list(client.chat(HI, temperature=0.0, max_tokens=2))
            chat_s = time.monotonic() - began
            began = time.monotonic()
            text = client.detokenize(chunks[-1].token_ids or [1])
            detok_s = time.monotonic() - began
            # A trusted template still renders, once the hostile ones were killed.
            custom = list(client.chat(HI, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                      max_tokens=1))
        print(f"after 7 hostile templates: chat {chat_s:.2f}s, detokenize {detok_s:.3f}s; codes {set(codes)}")
        assert chunks[-1].finish_reason in ("stop", "length") and isinstance(text, str) and custom
        assert chat_s < 10 and detok_s < 5
        with grpc.insecure_channel(pre.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        # Another hostile render in flight while SIGTERM arrives: the process still ends by itself.
        threading.Thread(target=hostile, args=(2,), daemon=True).start()
        time.sleep(0.5)
        began = time.monotonic()
        code = pre.stop(grace=20)
        assert code == 0 and time.monotonic() - began < 20, code
    finally:
        pre.stop()
        engine.stop()
