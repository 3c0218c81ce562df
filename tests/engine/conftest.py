"""Engine fixtures: one started engine per tiny model, shared by a module's tests."""

from __future__ import annotations

import pytest
import torch

from tests.engine.engine_factories import start_engine

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def text_engine(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"])
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def llava_engine(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-llava"])
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def idefics3_engine(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-idefics3"])
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def engines(tiny_dirs):
    """engines(name, **limits): an engine for that tiny model and those limits, started on first use, shared by the
    module's tests."""
    started: dict[tuple, object] = {}

    def get(name: str, **limits):
        key = (name, tuple(sorted(limits.items())))
        if key not in started:
            started[key] = start_engine(tiny_dirs[name], **limits)
        return started[key]

    yield get
    for engine in started.values():
        engine.stop()
