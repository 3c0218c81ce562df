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
