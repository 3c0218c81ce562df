"""Every block marked `<!-- runnable -->` in the README and docs/ runs as written against one stack on the default
model, as a user runs it after `splice up` with the virtual environment active: `splice` and `python` on PATH,
a fresh folder per document, its blocks in order (a later block may read the files an earlier one made). The
stack listens on free ports; the default addresses the examples name are rewritten to them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from app.launch import start_stack
from app.tiny import DEFAULT_MODEL
from tests.docs_blocks import DOCS, ROOT, blocks

RUNNABLE = {doc: [b for b in blocks(doc) if b.runnable] for doc in DOCS}


@pytest.fixture(scope="module")
def docs_stack():
    from app.tiny import ensure

    ensure(DEFAULT_MODEL)
    engine, pre = start_stack(DEFAULT_MODEL, http_port=0, engine_args=["--max-running-seqs", "8"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def user_env(docs_stack, tmp_path_factory):
    """PATH with `splice` and `python` as the activated venv has them (this tree's code), and the addresses."""
    bin_dir = tmp_path_factory.mktemp("venv-bin")
    for name, run in (("splice", "-m app.cli "), ("python", "")):  # a script, not a link: a venv's python
        shim = bin_dir / name                                           # finds its venv from its own path
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {run}"$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    engine, pre = docs_stack
    addresses = {"127.0.0.1:50051": pre.address, "127.0.0.1:8000": pre.http_address,
                 "127.0.0.1:50061": engine.address}
    return env, addresses


def test_the_docs_hold_runnable_examples_of_each_face():
    readme = RUNNABLE[ROOT / "README.md"]
    assert {b.lang for b in readme} == {"bash", "python"}
    assert any("SpliceClient" in b.text for b in readme) and any("from openai import" in b.text for b in readme)


@pytest.mark.parametrize("doc", [d for d in DOCS if RUNNABLE[d]], ids=lambda d: d.name)
def test_runnable_blocks_run_as_written(doc, user_env, tmp_path):
    env, addresses = user_env
    for i, block in enumerate(RUNNABLE[doc]):
        text = block.text
        for default, actual in addresses.items():
            text = text.replace(default, actual)
        if block.lang == "bash":
            argv = ["bash", "-e", "-o", "pipefail", "-c", text]
        elif block.lang == "python":
            script = tmp_path / f"block{i}.py"
            script.write_text(text)
            argv = [sys.executable, str(script)]
        else:
            pytest.fail(f"{block.where}: a runnable block must be bash or python, not {block.lang!r}")
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, (f"{block.where} failed ({out.returncode}):\n{out.stdout[-2000:]}\n"
                                     f"{out.stderr[-4000:]}")
