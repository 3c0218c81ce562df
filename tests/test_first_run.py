"""The first run's model build as a new user sees it: the colour model's training shows its progress and loss,
the libraries' bars and notices stay out, and Ctrl-C is one line and exit 130, no traceback, nothing half-built
left as a model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from app.tiny.names import DEFAULT_MODEL


@pytest.mark.integration
def test_first_run_training_shows_progress_and_ctrl_c_is_one_line(tmp_path):
    env = {**os.environ, "SPLICE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("TRANSFORMERS_VERBOSITY", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "build-tiny", DEFAULT_MODEL], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in proc.stderr:  # until the first progress line: training is under way
            lines.append(line)
            if line.startswith("training: step "):
                break
        assert lines and lines[-1].startswith("training: step 50/400, loss "), "".join(lines)
        float(lines[-1].rsplit(" ", 1)[1])
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(120) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = "".join(lines) + rest
    assert rest.splitlines()[-1] == "splice build-tiny: interrupted", shown
    for noise in ("Traceback", "KeyboardInterrupt", "Writing model shards", "Loading weights", "it/s]"):
        assert noise not in shown, shown
    assert lines[0].startswith(f"building {DEFAULT_MODEL} "), shown
    assert not list(tmp_path.rglob("splice_tiny.json")), "an interrupted build left a model"
