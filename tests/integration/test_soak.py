"""The short CI version of bench/soak.py: concurrent streams of text, prompt embeddings and images through the
async client for a few seconds; no errors and every stream's tokens equal its usage."""

from __future__ import annotations

import asyncio

from tests.harness.soak import soak


def test_soak_short(stack):
    engine, pre = stack
    result = asyncio.run(soak(pre.address, streams=8, seconds=15,
                              pids={"engine": engine.proc.pid, "preprocessor": pre.proc.pid}))
    print(result.report())
    assert not result.errors, result.errors[:5]
    assert not result.mismatches, result.mismatches[:5]
    assert all(n > 0 for n in result.requests.values()), result.requests
    assert all(s.alive for s in stack)
