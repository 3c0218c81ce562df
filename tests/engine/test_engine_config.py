"""EngineConfig validates itself; the loader picks device and dtype as documented."""

from __future__ import annotations

import os

import pytest
import torch

from engine.config import EngineConfig, auto_compute_threads, auto_torch_threads, usable_cpus
from engine.loader import pick_device, pick_dtype


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(device="tpu"), "device must be"),
    (dict(device="cpu:1"), "device must be"),
    (dict(dtype="float8"), "dtype must be"),
    (dict(max_model_len=1), "max_model_len"),
    (dict(max_running_seqs=0), "max_running_seqs"),
    (dict(max_running_seqs=8, max_batch_tokens=4), "max_batch_tokens"),
    (dict(max_queue=-1), "max_queue"),
    (dict(mixed_prefill_tokens=0), "mixed_prefill_tokens"),
    (dict(stream_interval=0), "stream_interval"),
    (dict(encoder_cache_mb=-1), "encoder_cache_mb must be >= 0, got -1"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size"),
    (dict(torch_threads=0), "torch_threads must be >= 1, got 0"),
    (dict(simulate_forward_ms=-1.0), "simulate_forward_ms must be >= 0 and < 60000, got -1.0"),
    (dict(simulate_forward_ms=5.0, tensor_parallel_size=2), "simulate_forward_ms needs tensor_parallel_size 1"),
    (dict(model_impl="vllm"), r"model_impl must be one of \('auto', 'splice', 'transformers'\), got 'vllm'"),
])
def test_invalid_configs_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="m", **kwargs)


def test_defaults_and_served_name():
    cfg = EngineConfig(model="/some/folder")
    assert cfg.device == "auto" and cfg.dtype == "auto" and cfg.served_name == "/some/folder"
    assert EngineConfig(model="/f", model_name="tiny-text", device="cuda:1").served_name == "tiny-text"


def test_auto_device_and_dtype():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == want

    class Config:
        dtype = "bfloat16"

    assert pick_dtype("auto", Config(), torch.device("cpu")) is torch.float32
    assert pick_dtype("auto", Config(), torch.device("cuda")) is torch.bfloat16
    assert pick_dtype("float16", Config(), torch.device("cpu")) is torch.float16


def _host(monkeypatch, cpus: int, env: str | None) -> None:
    """A host of `cpus` CPUs, with $OMP_NUM_THREADS = `env` (None: unset)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)


@pytest.mark.parametrize(("cpus", "env", "ranks", "want"), [
    (8, None, 1, 7),  # one CPU left to the serving loop and a co-located preprocessor
    (8, None, 2, 3),  # the rest shared by the tensor-parallel ranks
    (2, None, 1, 1),
    (1, None, 1, 1),  # never zero
    (3, None, 4, 1),
    (8, "3", 1, 3),  # OMP_NUM_THREADS, when set, is the operator's choice
    (8, "", 1, 7),  # set but empty or not a count: ignored, as by OpenMP
    (8, "many", 1, 7),
    (8, "0", 1, 7),
])
def test_auto_torch_threads(monkeypatch, tmp_path, cpus, env, ranks, want):
    _host(monkeypatch, cpus, env)
    assert auto_torch_threads(ranks, cpu_max=str(tmp_path / "none")) == want


@pytest.mark.parametrize(("cpus", "env", "ranks", "want"), [
    (8, None, 1, 8),  # a step of many prompt positions takes every CPU
    (2, None, 1, 2),
    (8, "3", 1, None),  # OMP_NUM_THREADS: the operator's count for every step
    (8, "0", 1, 8),
    (8, None, 2, None),  # tensor-parallel ranks keep their share
])
def test_auto_compute_threads(monkeypatch, tmp_path, cpus, env, ranks, want):
    _host(monkeypatch, cpus, env)
    assert auto_compute_threads(ranks, cpu_max=str(tmp_path / "none")) == want


@pytest.mark.parametrize(("cpu_max", "want"), [
    ("max 100000", 8),  # no quota
    ("200000 100000", 2),  # docker --cpus 2
    ("150000 100000", 2),  # 1.5 CPUs: rounded up
    ("50000 100000", 1),
    ("1600000 100000", 8),  # a quota above the affinity: the affinity
    ("garbage", 8),
])
def test_usable_cpus_reads_the_cgroup_quota(monkeypatch, tmp_path, cpu_max, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max + "\n")
    assert usable_cpus(str(path)) == want
    assert usable_cpus(str(tmp_path / "absent")) == 8
