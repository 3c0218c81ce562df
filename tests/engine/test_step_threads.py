"""engine/step_threads.py: the packed products run on the compute threads, so does all of a step of many prompt
positions, every other op on the usual count; the tokens do not depend on it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from engine.models import linear
from engine.step_threads import PREFILL_STEP_AT, StepThreads
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request


def test_the_count_follows_the_steps_prompt_positions():
    threads = StepThreads(usual=1, compute=2)
    try:
        assert [threads.count(n) for n in (0, 1, PREFILL_STEP_AT - 1, PREFILL_STEP_AT, 4096)] == [1, 1, 1, 2, 2]
    finally:
        threads.close()


def test_set_for_sets_the_calling_threads_count():
    threads = StepThreads(usual=1, compute=2)
    try:
        threads.set_for(PREFILL_STEP_AT)
        assert torch.get_num_threads() == 2
        threads.set_for(3)
        assert torch.get_num_threads() == 1
    finally:
        threads.close()
        torch.set_num_threads(1)


# A fresh process on one thread: OpenMP starts its second thread only when a parallel region asks for two, so the
# process's thread count shows which count a product ran on (the caller's count is printed after it).
_PRODUCT = textwrap.dedent("""
    import os, torch
    from engine.models import linear
    torch.set_num_threads(1)
    layer = linear.Linear(torch.randn(512, 512))
    x = torch.randn(64, 512)
    tasks = lambda: len(os.listdir("/proc/self/task"))
    want = layer(x)
    before = tasks()
    linear.product_threads(2)
    got = layer(x)
    print(layer.packed is not None, before, tasks(), torch.get_num_threads(), torch.equal(got, want) or
          bool(torch.allclose(got, want, atol=1e-5)))
""")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or not os.path.isdir("/proc/self/task"),
                    reason="oneDNN and /proc")
def test_a_product_runs_on_the_compute_threads_and_gives_the_callers_count_back():
    done = subprocess.run([sys.executable, "-c", _PRODUCT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    packed, before, after, threads_after, same = done.stdout.split()
    assert done.returncode == 0 and packed == "True", done.stderr
    assert int(after) == int(before) + 1  # OpenMP's second thread, started by the product
    assert threads_after == "1" and same == "True"


async def test_tokens_are_the_same_on_one_thread_and_with_compute_threads(tiny_dirs):
    """A long prompt (its prefill all on two threads) arriving while a short one decodes (its products on two): each
    request's greedy tokens equal those of an engine that runs everything on one thread. The engines run one after
    the other: the products' count is process-wide."""
    long_ids, short_ids = random_ids(3 * PREFILL_STEP_AT, seed=1), random_ids(12, seed=2)
    results = []
    for compute in (None, 2):
        engine = start_engine(tiny_dirs["tiny-text"], torch_threads=1, compute_threads=compute)
        try:
            assert (engine.threads is None) == (compute is None)
            short = asyncio.create_task(collect(engine, text_request(short_ids, "short", max_tokens=24)))
            long = await collect(engine, text_request(long_ids, "long", max_tokens=8))
            results.append((long[0], (await short)[0]))
        finally:
            engine.stop()
            torch.set_num_threads(1)  # what the engine thread set last is torch's default for threads started after
    assert linear._product_threads is None  # stop gave the products' count back
    assert results[0] == results[1]
    assert all(len(long) == 8 and len(short) == 24 for long, short in results)
