"""The issue's reproducer: request templates that would run for hours, abandoned by their clients, must not
stall the preprocessor (later Chat and Detokenize answer, health stays SERVING, SIGTERM ends it)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.launch import start_stack
from app.scrape import scrape, total
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL

HOSTILE = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
HI = [{"role": "user", "content": "Hi"}]
GUARD = 120.0  # seconds a wait for a state may take before it fails the test (a stall, not a slow machine)


def test_request_templates_are_refused_by_default(stack):
    _, pre = stack
    with SpliceClient(pre.address, timeout=60) as client:
        for kwargs in ({"chat_template": "{{ 'x' }}"}, {"chat_template_kwargs": {"chat_template": "{{ 'x' }}"}}):
            with pytest.raises(SpliceClientError) as err:
                list(client.chat(HI, max_tokens=1, **kwargs))
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--trust-request-chat-template" in err.value.details


def _chat_in_flight(pre) -> float:
    return total(scrape(pre), "splice_rpc_in_flight", method="Chat")


def _until(done, what: str) -> None:
    """Waits until `done()` holds; fails the test if it still does not after GUARD seconds."""
    deadline = time.monotonic() + GUARD
    while not done():
        assert time.monotonic() < deadline, f"still not {what} after {GUARD:g} s"
        time.sleep(0.05)


def _custom_template_renders(client: SpliceClient) -> bool:
    """A trusted request template renders, or the sandbox says its workers are still busy being replaced after
    the kills (RESOURCE_EXHAUSTED, "try again": False); any other outcome fails the test."""
    try:
        return bool(list(client.chat(HI, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
                                     max_tokens=1)))
    except SpliceClientError as exc:
        if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "try again" in exc.details:
            return False
        raise


def test_abandoned_hostile_templates_do_not_stall_the_preprocessor(tiny_dirs):
    """Not stalled means: once the hostile calls are over on the server (their refusals issued), later calls
    answer within their deadlines (GUARD: far past any slow machine, short of an hour-long render), and SIGTERM
    with a hostile render in flight still ends the process by itself."""
    engine, pre = start_stack(MODEL, preprocessor_args=["--trust-request-chat-template", "--chat-template-timeout",
                                                        "1", "--chat-template-workers", "2", "--metrics-port", "0"])
    try:
        codes: list[grpc.StatusCode] = []

        def hostile(i: int, deadline: float) -> None:
            with SpliceClient(pre.address, timeout=deadline) as client:
                try:
                    list(client.chat(HI, chat_template=HOSTILE, max_tokens=1))
                except SpliceClientError as exc:
                    codes.append(exc.code)

        threads = [threading.Thread(target=hostile, args=(i, 1.0 + i % 3)) for i in range(7)]  # abandoned after 1-3 s
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD)
        assert not any(t.is_alive() for t in threads)
        assert len(codes) == 7 and all(c != grpc.StatusCode.OK for c in codes), codes
        # The server is done with them too: each hostile render refused at its deadline or abandoned with its call.
        _until(lambda: _chat_in_flight(pre) == 0, "done with the hostile Chat calls")

        with SpliceClient(pre.address, timeout=GUARD) as client:
            chunks = list(client.chat(HI, temperature=0.0, max_tokens=2))
            text = client.detokenize(chunks[-1].token_ids or [1])
            # A trusted template still renders, once the killed workers are replaced.
            _until(lambda: _custom_template_renders(client), "rendering a trusted request template")
        print(f"after 7 hostile templates: codes {set(codes)}")
        assert chunks[-1].finish_reason in ("stop", "length") and isinstance(text, str)
        with grpc.insecure_channel(pre.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=GUARD).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        # Another hostile render in flight while SIGTERM arrives: the process still ends by itself (exit 0, not
        # killed at the guard). Its call is seen in flight on the server first; the server refuses it after 1 s,
        # so a call missed by a slow look is followed by another.
        def in_flight_now() -> bool:
            if _chat_in_flight(pre) >= 1:
                return True
            if not any(t.is_alive() for t in threading.enumerate() if t.name == "hostile"):
                threading.Thread(target=hostile, args=(0, GUARD), name="hostile", daemon=True).start()
            return False

        _until(in_flight_now, "a hostile Chat in flight")
        assert pre.stop(grace=GUARD) == 0
    finally:
        pre.stop()
        engine.stop()
