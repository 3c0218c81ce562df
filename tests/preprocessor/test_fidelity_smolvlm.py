"""Fidelity: for SmolVLM-256M's real processor files, the preprocessor's IDs equal what HF's own
processor produces for the same conversation (sentinel spans aside). Skipped without ../shared/models."""

from __future__ import annotations

import pytest
from transformers import AutoProcessor

from preprocessor.core import PreprocessorCore
from tests.preprocessor.fidelity import CONVERSATIONS, check_embeds_outside_the_spans, hf_ids
from tests.preprocessor.pp_factories import conversation, files_for, model_info_from_config

pytestmark = pytest.mark.fidelity
SMOLVLM = "HuggingFaceTB__SmolVLM-256M-Instruct"


@pytest.fixture(scope="module")
def smolvlm(shared_models):
    path = shared_models / SMOLVLM
    info = model_info_from_config(path)
    assert info.vocab_rows == 49280
    return PreprocessorCore(files_for(path), info), AutoProcessor.from_pretrained(path, backend="pil")


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_equal_hf_processor(smolvlm, name):
    core, proc = smolvlm
    turns = CONVERSATIONS[name]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == hf_ids(proc, turns)


def test_ids_with_embeds_equal_hf_outside_the_spans(smolvlm):
    core, proc = smolvlm
    req = check_embeds_outside_the_spans(core, proc, 576).request
    # Before consumption the sentinels are past the 49280 embedding rows; after it, no ID is.
    assert min(core.files.sentinels.ids) >= 49280 == core.info.vocab_rows
    assert max(req.token_ids) < 49280


@pytest.mark.parametrize("name", ["image", "multi_turn"])
def test_llava_15_ids_equal_hf_processor(shared_models, name):
    # llava-1.5 has headroom (32002 tokens, 32064 rows): the same path must hold there too.
    path = shared_models / "llava-hf__llava-1.5-7b-hf"
    core = PreprocessorCore(files_for(path), model_info_from_config(path))
    turns = [t for t in CONVERSATIONS[name] if t[0] != "system"]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == hf_ids(AutoProcessor.from_pretrained(path, backend="pil"), turns)
