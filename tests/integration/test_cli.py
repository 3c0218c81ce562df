"""`splice up` and `splice chat` as a user runs them: processes, real ports, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import torch
from safetensors.torch import save_file

from app.demo import embedding_rows, sample_picture
from tests.integration.conftest import MODEL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_then_chat_with_image_and_embeds_then_ctrl_c(model_dir, tmp_path):
    port, engine_port, http_port = free_port(), free_port(), free_port()
    up = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--model", MODEL, "--port", str(port),
                           "--engine-port", str(engine_port), "--http-port", str(http_port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=os.environ.copy())
    try:
        lines = []
        deadline = time.monotonic() + 240
        for line in up.stdout:
            lines.append(line)
            if line.startswith("splice up:"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert f"127.0.0.1:{port}" in lines[-1] and f"127.0.0.1:{engine_port}" in lines[-1], "".join(lines)
        assert any("noise" in line for line in lines), "the random-weights note is shown once"
        assert f"http serving on 127.0.0.1:{http_port}\n" in lines, "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=30) as resp:
            assert json.load(resp)["data"][0]["id"] == MODEL

        image = tmp_path / "pic.png"
        sample_picture().save(image)
        embeds = tmp_path / "soft.safetensors"
        save_file({"embeds": embedding_rows(model_dir, [1, 2, 3, 4]).to(torch.float32).contiguous()}, str(embeds))
        chat = subprocess.run([sys.executable, "-m", "app.cli", "chat", "What is this?", "--target",
                               f"127.0.0.1:{port}", "--image", str(image), "--embeds", str(embeds),
                               "--max-tokens", "5"], capture_output=True, text=True, timeout=120)
        assert chat.returncode == 0, chat.stderr
        assert "finish_reason=" in chat.stderr and "completion_tokens=" in chat.stderr

        controlled = subprocess.run([sys.executable, "-m", "app.cli", "chat", "Hi", "--target", f"127.0.0.1:{port}",
                                     "--max-tokens", "4", "--min-tokens", "4", "--repetition-penalty", "1.3",
                                     "--min-p", "0.1", "--bad-words", "the", "--logit-bias", "5=-3"],
                                    capture_output=True, text=True, timeout=120)
        assert controlled.returncode == 0 and "completion_tokens=4" in controlled.stderr, controlled.stderr
        choices = subprocess.run([sys.executable, "-m", "app.cli", "chat", "Hi", "--target", f"127.0.0.1:{port}",
                                  "--max-tokens", "3", "--ignore-eos", "--temperature", "1", "--seed", "5", "--n", "2"],
                                 capture_output=True, text=True, timeout=120)
        assert choices.returncode == 0, choices.stderr
        assert "--- choice 0\n" in choices.stdout and "--- choice 1\n" in choices.stdout, choices.stdout
        assert "finish_reason=length,length" in choices.stderr and "completion_tokens=6" in choices.stderr
        out_of_range = subprocess.run([sys.executable, "-m", "app.cli", "chat", "Hi", "--target", f"127.0.0.1:{port}",
                                       "--presence-penalty", "3"], capture_output=True, text=True, timeout=120)
        assert out_of_range.returncode == 1 and "presence_penalty" in out_of_range.stderr, out_of_range.stderr

        bad = subprocess.run([sys.executable, "-m", "app.cli", "chat", "Hi", "--target", f"127.0.0.1:{port}",
                              "--image", str(embeds)], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr

        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        for p in (port, engine_port, http_port):  # both services are gone
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", p)) != 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
