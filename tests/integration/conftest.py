"""Integration fixtures: the engine and the preprocessor as real processes on loopback ports."""

from __future__ import annotations

import pytest

from app.demo import embedding_rows, sample_picture
from app.launch import start_stack

MODEL = "tiny-idefics3"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tiny_dirs):
    """One engine + preprocessor for the tests that leave them running."""
    engine, pre = start_stack(MODEL, engine_args=["--max-running-seqs", "4"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="session")
def model_dir(tiny_dirs):
    return tiny_dirs[MODEL]


@pytest.fixture(scope="session")
def mixed_messages(model_dir):
    """Two prompt-embeds spans of different lengths (rows of the model's own table) and an image."""
    return [{"role": "user", "content": [
        {"type": "text", "text": "First soft prompt:"},
        {"type": "prompt_embeds", "prompt_embeds": embedding_rows(model_dir, [5, 6, 7])},
        {"type": "text", "text": " then a picture "},
        {"type": "image", "image": sample_picture(80, 40)},
        {"type": "text", "text": " and a second one:"},
        {"type": "prompt_embeds", "prompt_embeds": embedding_rows(model_dir, [10, 11, 12, 13, 14, 15, 16])},
        {"type": "text", "text": " Describe it."},
    ]}]
