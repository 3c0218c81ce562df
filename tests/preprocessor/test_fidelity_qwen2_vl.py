"""Fidelity: for Qwen2-VL-2B's real processor files, the preprocessor's IDs equal what HF's own Qwen2VLProcessor
produces for the same conversation (sentinel spans aside). Qwen2-VL has headroom (151657 tokens, 151936 rows):
the sentinels land inside the table, and still never reach the engine. Skipped without ../shared/models.

HF's processor is Qwen2VLProcessor itself, loaded without its video processor (which needs torchvision);
images and text go through exactly its code."""

from __future__ import annotations

import pytest

from preprocessor.core import PreprocessorCore
from preprocessor.processor_parts import load_processor_from_parts
from tests.preprocessor import fidelity
from tests.preprocessor.fidelity import check_embeds_outside_the_spans, hf_ids
from tests.preprocessor.pp_factories import conversation, files_for, model_info_from_config

pytestmark = pytest.mark.fidelity
QWEN2_VL = "Qwen__Qwen2-VL-2B-Instruct"
CONVERSATIONS = {**fidelity.CONVERSATIONS, "system": [("system", "Answer briefly."), ("user", "Hi!")]}


@pytest.fixture(scope="module")
def qwen(shared_models):
    path = shared_models / QWEN2_VL
    if not path.is_dir():
        pytest.skip(f"{QWEN2_VL} not present in {shared_models}")
    info = model_info_from_config(path)
    assert info.vocab_rows == 151936
    hf = load_processor_from_parts(path)
    return PreprocessorCore(files_for(path), info), hf


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_equal_hf_processor(qwen, name):
    core, proc = qwen
    turns = CONVERSATIONS[name]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == hf_ids(proc, turns)


def test_ids_with_embeds_equal_hf_outside_the_spans(qwen):
    core, proc = qwen
    req = check_embeds_outside_the_spans(core, proc, 1536).request
    s0, s1 = core.files.sentinels.ids[:2]
    # Headroom: the sentinels are inside the 151936 rows, an ID the engine would embed; none reaches it.
    assert core.files.base_vocab == 151657 <= s0 < s1 < core.info.vocab_rows
    assert not set(req.token_ids) & core.files.sentinels.id_set
    grid = req.model_inputs["image_grid_thw"]
    assert req.token_ids.count(core.info.image_token_id) == int(grid.prod(-1).sum()) // 4
