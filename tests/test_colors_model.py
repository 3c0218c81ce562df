"""The trained default model's task and trainer: the task's text tokenizes into whole words, training inputs are
exactly the processor's, held-out pairs stay out of training, and training is deterministic at its thread count."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoProcessor

from app.models import model_note
from app.tiny import DEFAULT_MODEL, TINY_MODELS, colors
from app.tiny.corpus import CORPUS
from app.tiny.families.idefics3 import build_idefics3
from app.tiny.train import TrainConfig, prompt_ids, train_colors


@pytest.fixture(scope="module")
def processor(tiny_dirs):
    return AutoProcessor.from_pretrained(tiny_dirs[DEFAULT_MODEL])


def test_the_default_is_the_trained_idefics3():
    spec = TINY_MODELS[DEFAULT_MODEL]
    assert spec.trained and spec.family == "idefics3"
    assert not any(m.trained for m in TINY_MODELS.values() if m.name != DEFAULT_MODEL), "the others stay random"
    assert "noise" not in model_note(DEFAULT_MODEL) and "noise" in model_note("tiny-idefics3")


def test_colour_words_and_phrasings_are_whole_tokens(processor):
    tok = processor.tokenizer
    for name in colors.NAMES:
        assert len(tok(" " + name, add_special_tokens=False).input_ids) == 1, name
    for text in [*colors.QUESTIONS, colors.answer("blue", "purple")]:
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) <= len(text.split()) * 1.6, [tok.decode([i]) for i in ids]


def test_the_other_tiny_models_keep_their_tokenizers(tiny_dirs):
    """Only the trained model's tokenizer learns the task's words."""
    tok = AutoProcessor.from_pretrained(tiny_dirs["tiny-idefics3"]).tokenizer
    assert len(tok(" purple", add_special_tokens=False).input_ids) > 1


@pytest.mark.parametrize("seed", range(6))
def test_favorite_sentence_tokenizes_alone_as_in_the_prompt(processor, seed):
    """What makes its embedding rows a stand-in for it: the sentence's own IDs appear verbatim in the prompt."""
    tok = processor.tokenizer
    ex = colors.example("red", "cyan", random.Random(seed))
    alone = tok(ex.favorite_text, add_special_tokens=False).input_ids
    prompt = tok(tok.apply_chat_template(ex.messages(), tokenize=False, add_generation_prompt=True),
                 add_special_tokens=False).input_ids
    assert any(prompt[i:i + len(alone)] == alone for i in range(len(prompt))), ex.content


@pytest.mark.parametrize("seed", range(4))
def test_training_prompts_are_the_processors(processor, seed):
    rng = random.Random(seed)
    ex = colors.example("green", "pink", rng)
    image = colors.picture("green", rng)
    placeholder = processor.tokenizer.convert_tokens_to_ids("<image>")
    expansion = processor(text="<image>", images=[[image]]).input_ids[0]
    prompt = processor.apply_chat_template(ex.messages(), add_generation_prompt=True)
    assert prompt_ids(processor.tokenizer, ex.messages(), placeholder, expansion) == \
        processor(text=prompt, images=[[image]]).input_ids[0]


def test_held_out_pairs_are_never_trained():
    assert len(colors.HELD_OUT) == 24 and not colors.HELD_OUT & set(colors.TRAIN_PAIRS)
    assert len(colors.TRAIN_PAIRS) + len(colors.HELD_OUT) == len(colors.NAMES) ** 2
    assert colors.DEMO_PAIR in colors.HELD_OUT
    for name in colors.NAMES:  # every colour is still trained as a picture and as a favourite
        assert any(p == name for p, _ in colors.TRAIN_PAIRS) and any(f == name for _, f in colors.TRAIN_PAIRS)


def test_pictures_are_mostly_their_colour():
    rng = random.Random(0)
    for name, rgb in colors.COLORS.items():
        pixels = torch.frombuffer(bytearray(colors.picture(name, rng).tobytes()), dtype=torch.uint8).view(-1, 3)
        near = ((pixels.int() - torch.tensor(rgb)).abs().amax(dim=1) <= 40).float().mean()
        assert near >= 0.75, name


def test_answers_are_read_back():
    assert colors.read_answer(" " + colors.answer("blue", "purple")) == ("blue", "purple")
    assert colors.read_answer("blue purple") is None


def _train_short(out, threads_before: int) -> bytes:
    torch.manual_seed(0)
    build_idefics3(out, corpus=CORPUS + colors.corpus())
    torch.set_num_threads(threads_before)
    train_colors(out, seed=0, config=TrainConfig(steps=3, batch=4, pictures_per_color=1))
    assert torch.get_num_threads() == threads_before, "the trainer restores the caller's thread count"
    return (out / "model.safetensors").read_bytes()


def test_training_is_deterministic_whatever_the_callers_thread_count(tmp_path):
    before = torch.get_num_threads()
    try:
        first = _train_short(tmp_path / "a", 1)
        second = _train_short(tmp_path / "b", 2)
    finally:
        torch.set_num_threads(before)
    assert first == second
    untrained = tmp_path / "c"
    torch.manual_seed(0)
    build_idefics3(untrained, corpus=CORPUS + colors.corpus())
    assert (untrained / "model.safetensors").read_bytes() != first, "training changed the weights"
