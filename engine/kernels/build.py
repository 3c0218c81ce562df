"""Compiles a kernel's C source once per host and loads it: `library(source)` -> ctypes.CDLL, or None where it
cannot be built (no gcc, a failed compile, SPLICE_CPU_KERNELS=0), said once in the log.

Why C through ctypes rather than a torch extension: the kernels take raw pointers and strides and return status
codes, so they need neither torch's headers nor Python's, nor ninja; only gcc, which the machines Splice installs
on have (a wheel-less source build of many packages needs it too). ctypes releases the GIL during the call.

The shared object is cached under $SPLICE_CACHE/kernels, named by a hash of the source, the compiler's version and
the CPU's flags (-march=native builds for the host it runs on, so a cache shared between different CPUs keeps one
build per kind), and written atomically: concurrent engines compile at most once each and load a complete file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

from splice.cache_dir import cache_dir

log = logging.getLogger(__name__)

ENV = "SPLICE_CPU_KERNELS"  # "0": never build nor use them (torch's ops everywhere)
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 120


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _compiler_version(cc: str) -> str | None:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def library(source: Path, cc: str = "gcc") -> ctypes.CDLL | None:
    """The compiled `source`, built into the cache on first use; None (logged) where it cannot be."""
    if not enabled():
        log.info("%s=0: %s not used", ENV, source.name)
        return None
    version = _compiler_version(cc)
    if version is None:
        log.warning("%s not found: %s not built, torch's ops run instead", cc, source.name)
        return None
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, version.encode(), _cpu_flags().encode(), " ".join(FLAGS).encode()]))
    out = cache_dir() / "kernels" / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            done = subprocess.run([cc, *FLAGS, "-o", tmp, str(source)], capture_output=True, text=True,
                                  timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                log.warning("%s failed to compile, torch's ops run instead:\n%s", source.name, done.stderr[-2000:])
                return None
            os.replace(tmp, out)
        except subprocess.SubprocessError as e:
            log.warning("%s not built (%s), torch's ops run instead", source.name, e)
            return None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("compiled %s for this CPU in %.1f s (kept in %s)", source.name, time.monotonic() - started, out)
    try:
        return ctypes.CDLL(str(out))
    except OSError as e:
        log.warning("%s could not be loaded (%s), torch's ops run instead", out, e)
        return None


def function(source: Path, name: str, argtypes: list, serves: str) -> ctypes._CFuncPtr | None:
    """`name` of the compiled `source`, typed (its arguments `argtypes`, an int status back); None where the library
    is not built or its `serves()` says this build has no path for this CPU."""
    lib = library(source)
    if lib is None or not getattr(lib, serves)():
        return None
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn
