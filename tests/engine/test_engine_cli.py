"""`splice engine` as a process: prints its address when ready, health SERVING, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splice import heap
from splice.v1 import common_pb2, engine_pb2_grpc


@pytest.mark.integration
def test_cli_serves_on_the_printed_port_and_stops_cleanly(tiny_dirs):
    cmd = [sys.executable, "-m", "app.cli", "engine", "--model", "tiny-text", "--port", "0",
           "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("engine serving on 127.0.0.1:"), line
        address = line.removeprefix("engine serving on ")
        assert not address.endswith(":0")
        with grpc.insecure_channel(address) as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            info = engine_pb2_grpc.EngineStub(ch).GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10)
            assert info.model == "tiny-text" and info.architecture == "LlamaForCausalLM"
        with open(f"/proc/{proc.pid}/environ", "rb") as f:  # a tiny model: not started again for huge pages
            assert heap.HUGE_PAGES_TUNABLE.encode() not in f.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _logged_threads(args: list[str], env: dict[str, str]) -> str:
    """The engine process's own start-up log line about its torch threads."""
    cmd = [sys.executable, "-m", "app.cli", "engine", "--model", "tiny-text", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("engine serving on"):
                break
        loading = [line for line in lines if "torch thread(s)" in line]
        assert len(loading) == 1, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        return loading[0].split(", ")[-1].split(" torch")[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_torch_threads_flag_then_omp_num_threads(tiny_dirs):
    """--torch-threads wins over $OMP_NUM_THREADS, which the default honours (the CPU-count rule is unit-tested
    in test_engine_config.py: this host's count is whatever CI runs on)."""
    assert _logged_threads(["--torch-threads", "3"], {"OMP_NUM_THREADS": "1"}) == "3"
    assert _logged_threads([], {"OMP_NUM_THREADS": "2"}) == "2"


@pytest.mark.parametrize(("flag", "named"), [("--torch-threads", "torch_threads"),
                                             ("--stream-interval", "stream_interval"),
                                             ("--max-running-seqs", "max_running_seqs")])
def test_a_flag_out_of_range_is_one_line_before_anything_loads(flag, named):
    done = subprocess.run([sys.executable, "-m", "app.cli", "engine", "--model", "no-such-model", "--port", "0",
                           flag, "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"splice engine: {named} must be >= 1, got 0", done.stderr
    assert "Traceback" not in done.stderr


def test_simulate_forward_ms_out_of_range_or_with_tensor_parallelism_is_one_line():
    for flags, said in ((["--simulate-forward-ms", "-1"], "simulate_forward_ms must be >= 0 and < 60000, got -1.0"),
                        (["--simulate-forward-ms", "10", "--tensor-parallel-size", "2"],
                         "simulate_forward_ms needs tensor_parallel_size 1 (a simulated forward has no shards), "
                         "got 2")):
        done = subprocess.run([sys.executable, "-m", "app.cli", "engine", "--model", "no-such-model", "--port", "0",
                               *flags], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines()[-1] == f"splice engine: {said}", done.stderr
