"""One declaration per model family (splice/families.py), read by both services: every served model_type has one,
and every declaration has the entry each part of Splice needs — the engine's class, the preprocessor's geometry,
mm_processor_kwargs checks and PIL substitutes, its tiny models, its case in tests/engine/family_cases.py and its
row in docs/engine.md — and the declared facts are the ones its tiny checkpoints have."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoConfig

from app.tiny import TINY_MODELS
from engine.models import FAMILIES as ENGINE_CLASSES
from engine.models import ModelFamily, family_for
from preprocessor.embeds_geometry import GEOMETRIES
from preprocessor.mm_kwargs import CHECKS
from preprocessor.model_files import load_model_files
from preprocessor.pil_image_processors import SUBSTITUTES
from splice.errors import FailedPrecondition
from splice.families import FAMILIES, TEXT, by_model_type
from tests.engine.family_cases import CASES

ROOT = Path(__file__).resolve().parents[1]
DECLARED = [pytest.param(f, id=f.name) for f in FAMILIES]


def _once(values: list[str]) -> list[str]:
    return [v for v, n in Counter(values).items() if n > 1]


def test_each_model_type_processor_and_tiny_model_is_declared_once():
    assert not _once([t for f in FAMILIES for t in f.model_types])
    assert not _once([p for f in FAMILIES for p in f.processors])
    assert not _once([t for f in FAMILIES for t in f.torchvision_image_processors])
    assert not _once([t for f in FAMILIES for t in f.tiny])
    assert not _once([f.name for f in FAMILIES])
    assert sorted(t for f in FAMILIES for t in f.tiny) == sorted(TINY_MODELS)


@pytest.mark.parametrize("family", DECLARED)
def test_the_engine_runs_each_declared_family_with_its_own_class(family):
    cls = ENGINE_CLASSES[family.name]
    if family is TEXT:
        assert cls is ModelFamily and not family.model_types
    else:
        assert cls.__module__ == f"engine.models.{family.name}" and family.model_types
    for model_type in family.model_types:
        assert family_for(AutoConfig.for_model(model_type)) is cls


def test_the_engine_has_no_class_beyond_the_declarations():
    assert set(ENGINE_CLASSES) == {f.name for f in FAMILIES}


def test_an_undeclared_model_type_is_a_text_model_or_refused_naming_the_served_ones():
    assert family_for(AutoConfig.for_model("llama")) is ModelFamily
    with pytest.raises(FailedPrecondition, match="vision model type 'paligemma' is not supported") as refused:
        family_for(AutoConfig.for_model("paligemma"))
    assert all(repr(t) in str(refused.value) for f in FAMILIES for t in f.model_types)


@pytest.mark.parametrize("family", DECLARED)
def test_the_preprocessor_has_each_declared_familys_entries(family):
    assert bool(family.processors) == (family.geometry is not None), "a vision family says how its embeds carry images"
    if family.geometry is not None:
        assert family.geometry in GEOMETRIES
    assert set(family.mm_kwargs) <= set(CHECKS)
    assert (family.name in SUBSTITUTES) == bool(family.torchvision_image_processors)


def test_the_preprocessor_has_no_entry_beyond_the_declarations():
    assert set(GEOMETRIES) == {f.geometry for f in FAMILIES if f.geometry is not None}
    assert set(CHECKS) == {k for f in FAMILIES for k in f.mm_kwargs}
    assert set(SUBSTITUTES) <= {f.name for f in FAMILIES}


@pytest.mark.parametrize("family", DECLARED)
def test_each_family_has_its_tiny_builder_and_a_family_case(family):
    assert family.tiny
    for name in family.tiny:
        spec = TINY_MODELS[name]
        assert spec.build.__module__ == f"app.tiny.families.{family.name}"
        assert spec.family == family.name or spec.family in family.model_types
    assert any(case.tiny in family.tiny for case in CASES), "tests/engine/family_cases.py runs every family"


def test_every_family_case_is_a_declared_tiny_model():
    declared = {t for f in FAMILIES for t in f.tiny}
    assert {case.tiny for case in CASES} <= declared


@pytest.mark.parametrize("family", [f for f in DECLARED if f.values[0] is not TEXT])
def test_docs_engine_md_has_a_row_for_each_family(family):
    rows = [line for line in (ROOT / "docs" / "engine.md").read_text().splitlines()
            if line.startswith("| ") and f"(`{family.name}.py`)" in line]
    assert len(rows) == 1, f"docs/engine.md: the Families table has no row for engine/models/{family.name}.py"
    assert all(f"`{t}`" in rows[0] for t in family.model_types)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_a_tiny_checkpoint_has_its_familys_model_type_and_processor(tiny_dirs, name):
    family = next(f for f in FAMILIES if name in f.tiny)
    config = AutoConfig.from_pretrained(tiny_dirs[name])
    files = load_model_files(tiny_dirs[name])
    if family is TEXT:
        assert by_model_type(config.model_type) is None and files.processor is None
    else:
        assert by_model_type(config.model_type) is family
        assert type(files.processor).__name__ in family.processors
