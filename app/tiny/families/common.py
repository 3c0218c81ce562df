"""Sizes every tiny family shares, and the text config and vocabulary sizes built from a tokenizer."""

from __future__ import annotations

# Sizes shared by every tiny text backbone.
TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# Vision towers: 32x32 pixels in 8x8 patches = 16 patches per image (or tile).
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=32, patch_size=8)


def text_config_kwargs(tok) -> dict:
    """TEXT with the tokenizer's size and special ids: vocab_size == len(tok), no headroom."""
    return dict(TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)


def padded_vocab(tok) -> int:
    """The next multiple of 64 above len(tok): rows no token uses, where a registered sentinel lands."""
    return (len(tok) // 64 + 1) * 64
