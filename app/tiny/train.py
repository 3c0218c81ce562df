"""Trains a saved tiny Idefics3 checkpoint on the colour task (app/tiny/colors.py), in place, deterministically.

The language model and the connector learn; the vision tower stays as built (random, frozen), so its outputs for
a fixed pool of pictures are computed once. Every batch is built the way the preprocessor builds a request: the
chat template renders the conversation, the image placeholder becomes the processor's own expansion of that
picture, and the image-token positions take the connector's rows, as the engine merges them. The loss covers
only the answer and the end-of-utterance token that ends it.

Deterministic from the seed at a fixed thread count (CPU float results depend on how work is split over
threads), so the trainer sets TRAIN_THREADS itself and restores the caller's setting afterwards.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from app.tiny import colors


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400
    batch: int = 32
    lr: float = 3e-3  # 6e-3 and more got stuck on some seeds
    weight_decay: float = 0.0
    warmup: int = 20
    pictures_per_color: int = 24
    threads: int = 1  # the tensors are too small to gain from more, and one thread does not stall on a busy core


TRAIN = TrainConfig()
INFO = "splice_training.json"  # what was trained and its final loss (no timings: the files are deterministic)
PROGRESS_EVERY = 50  # steps between progress lines
log = logging.getLogger("splice.tiny")


@dataclass
class _Picture:
    color: str
    ids: list[int]  # the processor's expansion of one image placeholder for this picture
    states: torch.Tensor  # vision tower output, [tiles, patches, vision_hidden]


def train_colors(out: Path, seed: int, config: TrainConfig = TRAIN) -> dict:
    """Loads the checkpoint in `out`, trains it, saves it back; writes INFO and returns it with the seconds taken."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(out, seed, config)
    finally:
        torch.set_num_threads(threads)


def _train(out: Path, seed: int, config: TrainConfig) -> dict:
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    start = time.monotonic()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    processor = AutoProcessor.from_pretrained(out)
    tok = processor.tokenizer
    model = Idefics3ForConditionalGeneration.from_pretrained(out)
    image_id = model.config.image_token_id
    placeholder = tok.convert_tokens_to_ids("<image>")
    end_id = tok.convert_tokens_to_ids("<end_of_utterance>")

    model.model.vision_model.requires_grad_(False)
    pool = _picture_pool(model, processor, rng, config.pictures_per_color)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / config.warmup)
                                              * max(0.0, 1 - s / config.steps) ** 0.5)
    model.train()
    losses = []
    log.info("training on the colour task: %d steps", config.steps)
    for step in range(1, config.steps + 1):
        batch = [_sample(rng, pool, tok, placeholder, end_id) for _ in range(config.batch)]
        loss = _loss(model, batch, image_id, tok.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % PROGRESS_EVERY == 0 and step < config.steps:  # a few seconds' worth on CPU
            recent = losses[-PROGRESS_EVERY:]
            log.info("training: step %d/%d, loss %.3f", step, config.steps, sum(recent) / len(recent))
    model.eval()
    model.save_pretrained(out)
    summary = {"task": "colors", "seed": seed, "config": asdict(config),
               "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 5)}
    (out / INFO).write_text(json.dumps(summary, indent=2) + "\n")
    seconds = round(time.monotonic() - start, 1)
    log.info("trained on the colour task in %.1f s (final loss %s)", seconds, summary["final_loss"])
    return {**summary, "seconds": seconds}


def _picture_pool(model, processor, rng: random.Random, per_color: int) -> dict[str, list[_Picture]]:
    pool: dict[str, list[_Picture]] = {c: [] for c in colors.NAMES}
    with torch.no_grad():
        for color in colors.NAMES:
            for _ in range(per_color):
                inputs = processor(text="<image>", images=[[colors.picture(color, rng)]], return_tensors="pt")
                out = model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                     pixel_attention_mask=inputs["pixel_attention_mask"])
                pool[color].append(_Picture(color, inputs["input_ids"][0].tolist(), out.last_hidden_state))
    return pool


def _sample(rng: random.Random, pool: dict[str, list[_Picture]], tok, placeholder: int, end_id: int,
            ) -> tuple[list[int], int, _Picture]:
    """(input IDs, where the answer starts, picture) for a random training conversation."""
    pic_color, fav_color = rng.choice(colors.TRAIN_PAIRS)
    ex = colors.example(pic_color, fav_color, rng)
    pic = rng.choice(pool[pic_color])
    ids = prompt_ids(tok, ex.messages(), placeholder, pic.ids)
    target = [*tok(" " + ex.answer, add_special_tokens=False).input_ids, end_id]
    return ids + target, len(ids), pic


def prompt_ids(tok, messages: list[dict], placeholder: int, image_ids: list[int]) -> list[int]:
    """The prompt's IDs as the processor makes them: the image placeholder is a special token, so the text on
    either side tokenizes alone and the placeholder can be swapped for the picture's expansion afterwards."""
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False).input_ids
    at = ids.index(placeholder)
    return ids[:at] + image_ids + ids[at + 1:]


def _loss(model, batch: list[tuple[list[int], int, _Picture]], image_id: int, pad_id: int) -> torch.Tensor:
    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100)
    for i, (seq, answer_at, _) in enumerate(batch):
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, answer_at:len(seq)] = ids[i, answer_at:len(seq)]
    states = torch.cat([pic.states for _, _, pic in batch])  # [tiles, patches, vision_hidden], batch order
    rows = model.model.connector(states).reshape(-1, model.config.text_config.hidden_size)
    embeds = model.model.text_model.get_input_embeddings()(ids)  # [batch, width, hidden]
    embeds = embeds.masked_scatter((ids == image_id).unsqueeze(-1), rows)
    hidden = model.model.text_model(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
    logits = model.lm_head(hidden[:, :-1])  # predicts positions 1..width-1
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
