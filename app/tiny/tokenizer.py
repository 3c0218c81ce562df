"""Builds a byte-level BPE tokenizer from the fixed corpus: no download, same files every time."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from app.tiny.corpus import CORPUS

BOS = "<|begin_of_text|>"
EOS = "<|im_end|>"
PAD = "<|pad|>"
BASE_SPECIALS = [PAD, BOS, "<|im_start|>", EOS, "<|endoftext|>"]
# Learned merges on top of the 256 byte symbols and the specials; small so that the embedding table
# stays tiny while common words are still single tokens.
MERGE_BUDGET = 400


def build_tokenizer(extra_specials: list[str], chat_template: str,
                    named: dict[str, str] | None = None, corpus: str = CORPUS) -> PreTrainedTokenizerFast:
    """A fast tokenizer whose specials are BASE_SPECIALS + extra_specials + named's values (all single tokens).
    `named` gives some of them attribute names (e.g. {"image_token": "<|image|>"} -> tok.image_token), as real
    tokenizers whose processors read them (Gemma 4) do. `corpus`: the text the merges are learned from."""
    extra_specials = extra_specials + [s for s in (named or {}).values() if s not in extra_specials]
    specials = BASE_SPECIALS + [s for s in extra_specials if s not in BASE_SPECIALS]
    core = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(specials) + MERGE_BUDGET,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus gives the trainer stable counts; training is single-pass and ordered.
    core.train_from_iterator([corpus] * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        # Named specials replace the plain list (one or the other); the unnamed ones stay special tokens all the same.
        extra_special_tokens=named or [s for s in specials if s not in (BOS, EOS, PAD)],
        chat_template=chat_template,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
        **(named or {}),
    )
    return tok
