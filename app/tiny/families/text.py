"""tiny-text: a Llama decoder, served by the plain text family (engine/models/base.py)."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import text_config_kwargs
from app.tiny.tokenizer import build_tokenizer


def build_text(out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer([], templates.CHATML)
    model = LlamaForCausalLM(LlamaConfig(**text_config_kwargs(tok)))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
