"""Fixtures of the preprocessor's unit tests (helpers live in pp_factories)."""

from __future__ import annotations

import pytest

from tests.preprocessor.pp_factories import files_for, model_info_from_config


@pytest.fixture(scope="session")
def tiny(tiny_dirs):
    """name -> (ModelFiles, ModelInfo) for the tiny models."""
    return {name: (files_for(path), model_info_from_config(path)) for name, path in tiny_dirs.items()}
