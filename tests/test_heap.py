"""splice/heap.py: after one large block has been freed (a big body, a whole answer), glibc serves blocks up to its
size from the heap, whose freed pages a few small survivors between them keep: hundreds of MiB of RSS kept for good.
With the thresholds fixed at start, or a trim after the work, they go back to the OS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from splice import heap

SCENARIO = """
import os, sys
from splice import heap
from tests.harness.up import rss_mib
if sys.argv[1] == "mapped":
    heap.keep_large_blocks_mapped()
big = bytearray(8 << 20)  # one large block, freed: glibc raises its mmap threshold to its size
del big
start = rss_mib(os.getpid())
blocks, survivors = [], []
for _ in range(300):
    blocks.append(bytearray(1 << 20))  # 1 MiB blocks (a large request's pieces) ...
    survivors.append(bytearray(1000))  # ... with small blocks that outlive them in between
del blocks
if sys.argv[1] == "trimmed":
    heap.trim()
print(rss_mib(os.getpid()) - start)
"""


def _kept(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCENARIO, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not heap.available(), reason="glibc's malloc_trim / mallopt are not available")
def test_freed_large_blocks_go_back_to_the_os():
    assert _kept("default") > 200  # the scenario is the problem: 300 MiB freed, kept
    assert _kept("mapped") < 32
    assert _kept("trimmed") < 32


IDLE = """
import gc, sys, threading, weakref
from splice import heap
gc.disable()  # no collection but the ones asked for
if sys.argv[1] == "frozen":
    from splice.service_main import freeze_startup_heap
    freeze_startup_heap()  # as a service does once it is loaded
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None)
trimmed = threading.Event()
real_trim = heap.trim
heap.trim = lambda: (real_trim(), trimmed.set())
class Node:
    pass
node = Node()
node.me = node  # a cycle, as a refused request's traceback and its frames
ref = weakref.ref(node)
del node
heap.trim_soon(idle=True)
assert trimmed.wait(60), "the trimming thread never trimmed"
print(len(full), ref() is None)
"""


@pytest.mark.parametrize(("mode", "collected"), [("frozen", True), ("plain", False)])
def test_an_idle_service_collects_its_cycles_but_an_embedding_program_is_not_walked(mode, collected):
    """Idle, a service (its start-up objects frozen) collects what requests left in cycles before the trim; in a
    program that embeds the engine (nothing frozen) a full collection would walk every object of the model (~260 ms
    holding the interpreter, in the middle of whatever it does next), so none is made."""
    out = subprocess.run([sys.executable, "-c", IDLE, mode], capture_output=True, text=True, check=True)
    assert out.stdout.split() == (["1", "True"] if collected else ["0", "False"])


ARENA = """
import ctypes, os, sys, threading
from splice import heap
from tests.harness.up import rss_mib
if sys.argv[1] == "engine":
    heap.serve_blocks_from_heap()  # as the engine's start does, before its threads
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
big = bytearray(31 << 20)  # one large block, freed: glibc raises its thresholds (mmap to its size, trim to twice)
del big
kept = []

def work():  # another thread (the engine's, a grammar compile's): 40 MiB of 1 MiB blocks, used and freed
    start = rss_mib(os.getpid())
    blocks = [libc.malloc(1 << 20) for _ in range(40)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks:
        libc.free(b)
    heap.trim()  # as the idle trim does
    kept.append(rss_mib(os.getpid()) - start)

t = threading.Thread(target=work)
t.start()
t.join()
print(kept[0])
"""


def _arena_kept(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", ARENA, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not heap.available(), reason="glibc's malloc_trim / mallopt are not available")
def test_what_another_thread_freed_goes_back_in_the_engine():
    assert _arena_kept("default") > 30  # the problem: that thread's arena's top, free, stays resident after a trim
    assert _arena_kept("engine") < 8


def test_the_engine_asks_for_huge_pages_once_and_keeps_what_the_environment_says():
    big = heap.HUGE_PAGES_MIN_WEIGHTS
    if heap.huge_pages_env({}, big) is None:
        pytest.skip("not glibc >= 2.35, or transparent huge pages are 'never' here")
    env = heap.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"}, big)
    assert env == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{heap.HUGE_PAGES_TUNABLE}", "HOME": "/h"}
    assert heap.huge_pages_env(env, big) is None  # the process started again with it: no second start
    assert heap.huge_pages_env({heap.HUGE_PAGES_ENV: "0"}, big) is None
    assert heap.huge_pages_env({}, big - 1) is None  # a small model: not worth the slower start
