"""The short CI version of bench/fuzz.py: hypothesis examples against every public RPC of the running stack, and
against its HTTP face."""

from __future__ import annotations

from tests.harness.fuzz_grpc import Fuzzer
from tests.integration.conftest import API_KEY


def test_every_public_rpc_answers_a_defined_status(stack):
    _, pre = stack
    fuzzer = Fuzzer(pre.address)
    ok = fuzzer.run(examples=25, seed=1)
    assert not fuzzer.undefined, "\n".join(fuzzer.undefined[:10])
    assert ok, fuzzer.counts
    assert all(s.alive for s in stack)


def test_the_http_face_never_answers_5xx(http_stack):
    """tests/harness/fuzz_http.py for at most ~30 s: its seeds, then hostile JSON bodies on every route."""
    from tests.harness.fuzz_http import HttpFuzzer

    _, pre = http_stack
    fuzzer = HttpFuzzer(f"http://{pre.http_address}", API_KEY)
    try:
        ok = fuzzer.run(examples=150, seed=1, budget=25.0)
    finally:
        fuzzer.close()
    assert not fuzzer.undefined, "\n".join(fuzzer.undefined[:10])
    assert ok, fuzzer.counts
    assert sum(fuzzer.counts.values()) > 200 and all(s.alive for s in http_stack)
