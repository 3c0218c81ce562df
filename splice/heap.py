"""Freed memory back to the operating system, so that a process's RSS comes back after a large request (glibc; a
no-op elsewhere).

glibc serves large blocks with mmap and unmaps them when freed, but after freeing one it raises that threshold to
the block's size (up to 32 MiB): from then on such blocks come from the heap, whose freed pages it keeps. One large
body or answer (a 25 MB `logit_bias`, a whole answer with logprobs) thus left the preprocessor's RSS tens of MB
higher for good, and each larger one higher still. `keep_large_blocks_mapped` (the preprocessor's start) fixes the
threshold at its default; `trim_soon` has a thread return the heap's free pages (malloc_trim) at most every TRIM_EVERY
seconds after requests end (both services).

The engine wants the opposite threshold: its per-step tensors (a few MB each) served from the heap, without a mapping
and page faults each, so `serve_blocks_from_heap` fixes both thresholds where glibc's raising would take them, and
gives every thread the main arena. Another thread allocates from an arena of its own otherwise (a heap of at most
64 MiB each), and malloc_trim returns free pages inside such a heap but never its free top, which glibc gives back
only when a free leaves it larger than the trim threshold (64 MiB once raised: never): the engine thread's arena and
each grammar-compiling thread's stayed resident at their peak (the hostile soak: a dozen arenas of ~40 MiB, all free).
The engine's threads mostly wait on the interpreter's lock, so one arena's lock costs them nothing measurable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import threading
import time

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 << 10  # glibc's default: blocks this large or larger are mapped on their own
MMAP_THRESHOLD_MAX = 32 << 20  # where glibc's raising of it stops (64-bit); the trim threshold goes to twice it
TRIM_EVERY = 2.0  # seconds between two trims at most (one costs a few ms, off the event loop, the GIL released)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def available() -> bool:
    """glibc's mallopt and malloc_trim are there (else every call here does nothing)."""
    return _libc() is not None


def keep_large_blocks_mapped() -> None:
    """Blocks of MMAP_THRESHOLD bytes or more are always mapped, and unmapped when freed (setting the thresholds
    turns glibc's raising of them off)."""
    if (libc := _libc()) is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, MMAP_THRESHOLD)


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"  # glibc >= 2.35: its heap and mapped blocks madvised for huge pages
HUGE_PAGES_ENV = "SPLICE_HUGE_PAGES"  # "0": the engine starts without them
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


HUGE_PAGES_MIN_WEIGHTS = 64 << 20  # weights smaller than this gain nothing worth the slower start


def huge_pages_env(environ: dict[str, str] | os._Environ, weights: int) -> dict[str, str] | None:
    """The environment to start the engine's process again in, so that glibc backs its heap with transparent huge
    pages, or None where that is done, off, not worth it (`weights`, their bytes on disk, below
    HUGE_PAGES_MIN_WEIGHTS) or not possible (not glibc >= 2.35, huge pages "never").

    Why: a decode step streams every weight from memory once (SmolLM2: 540 MB in float32), and with 4 KiB pages the
    walk through the page tables is part of that (135,000 pages a step). Through every packed linear of SmolLM2 at one
    row, three runs each: float32 39.5 -> 33.9 ms, bfloat16 21.4 -> 17.7 ms. The kernel's default on most
    distributions is "madvise" (huge pages only where asked), and glibc asks only when told at the process's start:
    a tunable, read once, so the process starts again (exec: the same pid, before the model loads). Its cost is the
    start: the kernel zeroes (and may compact memory for) 2 MiB at a time, and a tiny model's engine was ready
    1.2-2.3 s later, for nothing."""
    if (weights < HUGE_PAGES_MIN_WEIGHTS or environ.get(HUGE_PAGES_ENV) == "0"
            or HUGE_PAGES_TUNABLE in environ.get("GLIBC_TUNABLES", "")):
        return None
    lib, version = platform.libc_ver()
    if lib != "glibc" or tuple(int(v) for v in version.split(".")[:2] if v.isdigit()) < (2, 35):
        return None
    try:
        with open(THP_MODE) as f:
            if "[never]" in f.read():
                return None
    except OSError:
        return None
    tunables = ":".join(t for t in (environ.get("GLIBC_TUNABLES", ""), HUGE_PAGES_TUNABLE) if t)
    return {**environ, "GLIBC_TUNABLES": tunables}


def serve_blocks_from_heap() -> None:
    """Blocks smaller than MMAP_THRESHOLD_MAX come from the heap, whose pages are reused, and its free top is kept up
    to twice that (what glibc's own rule reaches after one large block, now from the start); threads started from now
    on allocate from the main arena, whose free top malloc_trim returns (the engine's start, before its threads)."""
    if (libc := _libc()) is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_MAX)
        libc.mallopt(M_ARENA_MAX, 1)


def trim() -> None:
    """The heap's free pages back to the OS (a few ms on a heap of hundreds of MB; call it after large work, not per
    request)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


_asked = threading.Event()
_collect = False  # the next trim collects cyclic garbage first
_collect_when_idle = False  # set by collect_when_idle (a service whose start-up objects are frozen)
_trimmer: threading.Thread | None = None
_lock = threading.Lock()


def _trim_when_asked() -> None:
    global _collect
    while True:
        _asked.wait()
        _asked.clear()
        if _collect:
            _collect = False
            gc.collect()
        trim()
        time.sleep(TRIM_EVERY)  # (asks meanwhile are answered by the next trim)


def collect_when_idle() -> None:
    """From now on an idle trim collects cyclic garbage first (service_main.freeze_startup_heap calls it once the
    start-up objects are frozen). A flag, not gc.get_freeze_count(): that call counts the frozen objects by walking
    them (~100 ms for a loaded engine, holding the interpreter), and it ran at every request's end."""
    global _collect_when_idle
    _collect_when_idle = True


def trim_soon(idle: bool = False) -> None:
    """Asks the trimming thread for a trim (cheap: call it whenever a request ends). `idle`: nothing is in flight any
    more; the trim first collects cyclic garbage (a refused request's traceback holds its frames, and their large
    locals, in a cycle), which an idle process's collector, run by allocations, would never reach. Only in a process
    whose start-up objects are frozen (a service, which calls collect_when_idle), where a full collection walks what
    requests left (~1 ms); elsewhere (an engine inside another program: a bench, a test) it would walk every
    object of the loaded model (~260 ms holding the interpreter) and stall whatever that program does next."""
    global _trimmer, _collect
    if idle and _collect_when_idle:
        _collect = True
    if _libc() is None and not idle:
        return
    if _trimmer is None:
        with _lock:
            if _trimmer is None:
                _trimmer = threading.Thread(target=_trim_when_asked, name="splice-heap-trim", daemon=True)
                _trimmer.start()
    _asked.set()
