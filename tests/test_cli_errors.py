"""`splice chat`'s first mistakes as one line each, a non-zero exit and no traceback: no server, a missing
image, a missing embeddings file."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest


def _chat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "chat", "Hi", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def closed_port():
    """A loopback port bound but not listening: connections to it are refused for as long as it is held."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_chat_without_a_server_says_to_start_one(closed_port):
    out = _chat("--target", f"127.0.0.1:{closed_port}")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"no Splice server at 127.0.0.1:{closed_port}: start one with 'splice up' "
                                  f"(or pass --target)")


def test_missing_image_and_missing_embeds_are_the_same_error(closed_port, tmp_path):
    image = _chat("--target", f"127.0.0.1:{closed_port}", "--image", str(tmp_path / "pic.png"))
    embeds = _chat("--target", f"127.0.0.1:{closed_port}", "--embeds", str(tmp_path / "soft.safetensors"))
    assert image.returncode == embeds.returncode == 2, (image.stderr, embeds.stderr)
    assert image.stderr == f"{tmp_path / 'pic.png'}: cannot read image (No such file or directory)\n"
    missing = tmp_path / "soft.safetensors"
    assert embeds.stderr == f"{missing}: cannot read prompt embeddings (No such file or directory)\n"


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command, flag", [("up", "--port"), ("up", "--engine-port"), ("up", "--http-port"),
                                           ("engine", "--port"), ("engine", "--metrics-port"),
                                           ("preprocessor", "--port"), ("preprocessor", "--http-port")])
def test_a_busy_port_names_its_flag_before_the_model_is_touched(busy_port, command, flag):
    # a model that cannot be had: its error would come first if the ports were checked after it
    ports = {"up": ["--port", "0", "--engine-port", "0", "--http-port", "0"], "engine": ["--port", "0"],
             "preprocessor": ["--port", "0"]}[command]
    argv = [*ports, flag, str(busy_port)] + ([] if command == "preprocessor" else ["--model", "/nonexistent/model"])
    out = subprocess.run([sys.executable, "-m", "app.cli", command, *argv], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (f"splice {command}: port {busy_port} on 127.0.0.1 is in use: pass {flag} to choose "
                          f"another (0: a free one)\n")


@pytest.mark.parametrize("command", ["up", "engine", "demo"])
def test_a_mistyped_built_in_model_is_one_line_with_the_name_meant(command):
    # no network here: were the name tried on the Hub first, the line would be about reaching the Hub
    out = subprocess.run([sys.executable, "-m", "app.cli", command, "--model", "tiny-idefics3-color"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "did you mean 'tiny-idefics3-colors'?" in last, out.stderr


CHECK = "import sys; from app.cli import main; code = main(sys.argv[1:]); print(code, 'torch' in sys.modules)"


@pytest.mark.parametrize("argv", [["up", "--model", "./no-such-folder"], ["up", "--model", "bad name!"],
                                  ["engine", "--model", "./no-such-folder"], ["engine", "--model", "tiny-txet"],
                                  ["preprocessor", "--model", "./no-such-folder"]])
def test_a_model_that_cannot_be_one_is_refused_before_torch_is_imported(argv):
    """The line comes at once: nothing heavy (torch, transformers) is imported to refuse it."""
    out = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.startswith(f"splice {argv[0]}: model")


def test_no_server_and_a_busy_port_are_said_before_torch_is_imported(closed_port, busy_port):
    for argv in (["chat", "Hi", "--target", f"127.0.0.1:{closed_port}"], ["up", "--http-port", str(busy_port)],
                 ["engine", "--port", str(busy_port)]):
        out = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == ["2", "False"], (argv, out.stdout, out.stderr)


def test_what_a_model_may_be_is_said_alike():
    """An HF id may be NAME (the Hub looks a bare name up) as well as ORG/NAME: every message says so; a path that
    is no folder is said to be one."""
    from app.models import HF_ID, check_model
    from splice.errors import FailedPrecondition

    for name, said in (("bad name!", HF_ID), ("tiny-txet", HF_ID), ("./no-such-folder", "does not exist")):
        with pytest.raises(FailedPrecondition, match=re.escape(said)):
            check_model(name)
    check_model("gpt2")  # a bare name is an HF id: looked up on the Hub, not refused here
