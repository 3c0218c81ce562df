"""The short CI version of bench/fuzz.py: hypothesis examples against every public RPC of the running stack."""

from __future__ import annotations

from bench.fuzz import Fuzzer


def test_every_public_rpc_answers_a_defined_status(stack):
    _, pre = stack
    fuzzer = Fuzzer(pre.address)
    ok = fuzzer.run(examples=25, seed=1)
    assert not fuzzer.undefined, "\n".join(fuzzer.undefined[:10])
    assert ok, fuzzer.counts
    assert all(s.alive for s in stack)
