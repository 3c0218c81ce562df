"""EngineConfig validates itself; the loader picks device and dtype as documented."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
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
    (dict(tensor_parallel_size=0), "tensor_parallel_size"),
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
