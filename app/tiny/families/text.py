"""tiny-text: a Llama decoder, served by the plain text family (engine/models/base.py), with a Hermes-style template
that renders tools (templates.HERMES_CHATML); tiny-text-bos: the same with ChatML and a tokenizer that adds a BOS,
as Llama 3's and Gemma's do."""

from __future__ import annotations

from pathlib import Path

from app.tiny import templates
from app.tiny.families.common import text_config_kwargs
from app.tiny.tokenizer import build_tokenizer


def build_text(out: Path, bos: bool = False) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer([], templates.BOS_CHATML if bos else templates.HERMES_CHATML)
    if bos:
        _prepend_bos(tok)
    model = LlamaForCausalLM(LlamaConfig(**text_config_kwargs(tok)))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)


def build_text_bos(out: Path) -> None:
    build_text(out, bos=True)


def _prepend_bos(tok) -> None:
    """Text tokenized with special tokens starts with the BOS (Llama 3's post-processor); the chat template writes
    its own, so a chat prompt is tokenized without them."""
    from tokenizers import processors

    bos = (tok.bos_token, tok.bos_token_id)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos[0]} $A", pair=f"{bos[0]} $A {bos[0]} $B", special_tokens=[bos])
