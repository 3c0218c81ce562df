"""tiny-idefics3, tiny-idefics3-colors (trained) and tiny-smolvlm: an Idefics3 tower and a Llama decoder; SmolVLM
is Idefics3 under other class names, with its own template and image normalisation (engine/models/idefics3.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from app.tiny import templates
from app.tiny.corpus import CORPUS
from app.tiny.families.common import VISION, text_config_kwargs
from app.tiny.tokenizer import build_tokenizer
from preprocessor.processor_parts import save_without_missing_parts, without_missing_parts

IDEFICS3_SPECIALS = (
    ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
)


def build_idefics3(out: Path, corpus: str = CORPUS) -> None:
    _build(out, corpus=corpus)


def build_smolvlm(out: Path) -> None:
    _build(out, smolvlm=True)


def build_idefics3_colors(out: Path) -> None:
    """tiny-idefics3, its tokenizer also learned from the colour task's text, then trained on that task (about a
    minute on CPU): the built-in model whose answers mean something."""
    from app.tiny import colors
    from app.tiny.train import train_colors

    build_idefics3(out, corpus=CORPUS + colors.corpus())
    train_colors(out, seed=torch.initial_seed())


def _build(out: Path, corpus: str = CORPUS, smolvlm: bool = False) -> None:
    import transformers
    from transformers import LlamaConfig

    prefix = "SmolVLM" if smolvlm else "Idefics3"
    template = templates.SMOLVLM if smolvlm else templates.IDEFICS3
    tok = build_tokenizer(IDEFICS3_SPECIALS, template, corpus=corpus)
    scale_factor = 2
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=getattr(transformers, f"{prefix}VisionConfig")(**VISION),
        text_config=LlamaConfig(**text_config_kwargs(tok)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=scale_factor,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_utterance>")]
    side = VISION["image_size"]
    # Images up to 2x2 tiles of 32 px plus the global view, like SmolVLM's 512 px tiles.
    normalize = dict(image_mean=[0.5] * 3, image_std=[0.5] * 3) if smolvlm else {}
    image_processor = getattr(transformers, f"{prefix}ImageProcessorPil")(
        size={"longest_edge": 2 * side}, max_image_size={"longest_edge": side}, **normalize)
    image_seq_len = (side // VISION["patch_size"]) ** 2 // scale_factor**2
    kwargs = dict(image_processor=image_processor, tokenizer=tok, image_seq_len=image_seq_len, chat_template=template)
    if smolvlm:  # SmolVLM's processor also has a video part, which needs torchvision: left out
        processor = without_missing_parts(transformers.SmolVLMProcessor)(**kwargs, video_processor=None)
    else:
        processor = transformers.Idefics3Processor(**kwargs)
    assert len(processor.tokenizer) == config.text_config.vocab_size, "processor added tokens"
    model.save_pretrained(out)
    if smolvlm:
        save_without_missing_parts(processor, out)
    else:
        processor.save_pretrained(out)
