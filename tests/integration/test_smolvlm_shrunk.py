"""The bug Splice exists for, on SmolVLM-256M's real files: its sentinel overflows the 49280-row vocab.

A random-weight SmolVLM is shrunk from the real config (same vocab, image token, scale factor, image
size and processor; fewer and narrower layers) into a temporary folder, with the real tokenizer,
processor and chat template beside it. The real engine and preprocessor serve it as processes.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from app.demo import embedding_rows, sample_picture
from app.launch import start_stack
from clients import SpliceClient
from preprocessor.model_files import load_model_files

SMOLVLM = "HuggingFaceTB__SmolVLM-256M-Instruct"
NON_WEIGHT_FILES = ("added_tokens.json", "chat_template.json", "generation_config.json", "merges.txt",
                    "preprocessor_config.json", "processor_config.json", "special_tokens_map.json", "tokenizer.json",
                    "tokenizer_config.json", "vocab.json")

pytestmark = pytest.mark.fidelity


@pytest.fixture(scope="module")
def shrunk_smolvlm(shared_models, tmp_path_factory):
    from transformers import AutoConfig, Idefics3ForConditionalGeneration

    src = shared_models / SMOLVLM
    out = tmp_path_factory.mktemp("smolvlm-shrunk")
    config = AutoConfig.from_pretrained(src)
    config.text_config.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16))
    config.vision_config.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2))
    torch.manual_seed(0)
    Idefics3ForConditionalGeneration(config).to(torch.float32).save_pretrained(out)
    for name in NON_WEIGHT_FILES:  # copied into the test's temporary folder only
        shutil.copy(src / name, out / name)
    return out


def test_smolvlm_sentinel_overflow_is_consumed_end_to_end(shrunk_smolvlm):
    engine, pre = start_stack(str(shrunk_smolvlm), engine_args=["--dtype", "float32"])
    try:
        embeds_a = embedding_rows(shrunk_smolvlm, [100, 200, 300])  # [3, 64]
        embeds_b = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))  # [5, 64]
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "Soft prompt:"},
            {"type": "prompt_embeds", "prompt_embeds": embeds_a},
            {"type": "image", "image": sample_picture(64, 48)},
            {"type": "text", "text": "and another"},
            {"type": "prompt_embeds", "prompt_embeds": embeds_b},
            {"type": "text", "text": "What do you see?"},
        ]}]
        with SpliceClient(pre.address, timeout=300) as client:
            info = client.model_info()
            tokenized = client.tokenize(messages)
            chunks = list(client.chat(messages, temperature=0.0, max_tokens=5, ignore_eos=True))
        assert info.vocab_rows == 49280 and info.image_token_id == 49190
        # the preprocessor's sentinels (registered as the service does it) lie past the last row...
        sentinel_ids = load_model_files(shrunk_smolvlm).sentinels.ids
        assert min(sentinel_ids) >= info.vocab_rows
        # ...and never reach the engine
        assert max(tokenized.token_ids) < info.vocab_rows and not set(sentinel_ids) & set(tokenized.token_ids)
        assert [length for _, length in tokenized.embed_spans] == [3, 5]
        assert tokenized.image_token_counts[0] == tokenized.token_ids.count(info.image_token_id) > 0
        assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 5
        assert chunks[-1].usage.prompt_tokens == len(tokenized.token_ids)
    finally:
        pre.stop()
        engine.stop()
