"""The trained default model through the real services: held-out colour pairs are answered right with the
favourite-colour sentence as text and as prompt embeddings; the answer follows the supplied rows (swapped or
replaced rows change it); the HTTP face answers the same through the `openai` SDK; `splice demo` shows it."""

from __future__ import annotations

import base64
import io
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
from PIL import Image as PILImage
from transformers import AutoTokenizer

from app.demo import ask, embedding_rows, vllm_base64
from app.launch import start_stack
from app.tiny import DEFAULT_MODEL, colors
from clients import SpliceClient
from splice.v1 import preprocessor_pb2 as pp

EXAMPLES_PER_PAIR = 2
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def colors_stack(tiny_dirs):
    engine, pre = start_stack(DEFAULT_MODEL, http_port=0, engine_args=["--max-running-seqs", "16"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(colors_stack):
    with SpliceClient(colors_stack[1].address, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def model_dir(tiny_dirs):
    return tiny_dirs[DEFAULT_MODEL]


@pytest.fixture(scope="module")
def tok(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def held_out():
    """(example, picture) for every held-out pair; pictures from a seed the trainer never used."""
    rng = random.Random(7)
    return [(colors.example(p, f, rng), colors.picture(p, rng))
            for p, f in sorted(colors.HELD_OUT) for _ in range(EXAMPLES_PER_PAIR)]


def _embeds_part(rows: torch.Tensor) -> dict:
    return {"type": "prompt_embeds", "prompt_embeds": pp.PromptEmbeds(torch_base64=vllm_base64(rows))}


def _answers(client, conversations: list[list[dict]]) -> list[tuple[str, str] | None]:
    """Sent concurrently, so the engine batches them: rows must land in their own sequence."""
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda m: ask(client, m, MAX_TOKENS)[0], conversations))
    return [colors.read_answer(a) for a in answers]


def _rate(named: list, expected: list) -> float:
    return sum(a == b for a, b in zip(named, expected, strict=True)) / len(expected)


def _sentence_rows(model_dir, tok, ex: colors.Example) -> tuple[list[int], torch.Tensor]:
    ids = tok(ex.favorite_text, add_special_tokens=False).input_ids
    return ids, embedding_rows(model_dir, ids)


def test_held_out_pairs_as_text_and_as_embeds(client, held_out, model_dir, tok):
    expected = [(ex.picture_color, ex.favorite_color) for ex, _ in held_out]
    as_text = _answers(client, [ex.messages(pic) for ex, pic in held_out])
    as_embeds = _answers(client, [ex.messages(pic, _embeds_part(_sentence_rows(model_dir, tok, ex)[1]))
                                  for ex, pic in held_out])
    text_rate, embeds_rate = _rate(as_text, expected), _rate(as_embeds, expected)
    print(f"held-out accuracy over {len(expected)} conversations: text {text_rate:.1%}, embeds {embeds_rate:.1%}")
    assert text_rate >= 0.95 and embeds_rate >= 0.95, (text_rate, embeds_rate)


def _single_token_colour(tok, ids: list[int], color: str) -> int | None:
    """Where the colour's one token sits in the sentence's IDs (None when the phrasing splits it)."""
    (cid,) = tok(" " + color, add_special_tokens=False).input_ids
    return ids.index(cid) if ids.count(cid) == 1 else None


@pytest.fixture(scope="module")
def swap_pairs(held_out, model_dir, tok):
    """Held-out conversations in pairs of different favourite colours, each with its sentence's IDs, rows and the
    colour row's position."""
    usable = []
    for ex, pic in held_out:
        ids, rows = _sentence_rows(model_dir, tok, ex)
        at = _single_token_colour(tok, ids, ex.favorite_color)
        if at is not None:
            usable.append((ex, pic, rows, at))
    pairs = [(a, b) for a, b in zip(usable[0::2], usable[1::2], strict=False) if a[0].favorite_color !=
             b[0].favorite_color]
    assert len(pairs) >= 10
    return pairs


def test_swapping_colour_rows_between_two_embeds_parts_swaps_the_answers(client, swap_pairs):
    conversations, supplied, stated = [], [], []
    for a, b in swap_pairs:
        (ex_a, pic_a, rows_a, at_a), (ex_b, pic_b, rows_b, at_b) = a, b
        swapped_a, swapped_b = rows_a.clone(), rows_b.clone()
        swapped_a[at_a], swapped_b[at_b] = rows_b[at_b], rows_a[at_a]
        conversations += [ex_a.messages(pic_a, _embeds_part(swapped_a)), ex_b.messages(pic_b, _embeds_part(swapped_b))]
        supplied += [(ex_a.picture_color, ex_b.favorite_color), (ex_b.picture_color, ex_a.favorite_color)]
        stated += [(ex_a.picture_color, ex_a.favorite_color), (ex_b.picture_color, ex_b.favorite_color)]
    named = _answers(client, conversations)
    follows, matches_text = _rate(named, supplied), _rate(named, stated)
    print(f"swapped colour rows: answers follow the rows in {follows:.1%}, the sentence in {matches_text:.1%}")
    assert follows >= 0.9 and matches_text <= 0.1


def test_rows_of_other_tokens_break_the_answer(client, swap_pairs, model_dir, tok):
    """The colour row replaced by the row of a word that is no colour: the stated colour is no longer named."""
    (other,) = tok(" picture", add_special_tokens=False).input_ids
    replacement = embedding_rows(model_dir, [other])[0]
    conversations, stated = [], []
    for pair in swap_pairs:
        for ex, pic, rows, at in pair:
            replaced = rows.clone()
            replaced[at] = replacement
            conversations.append(ex.messages(pic, _embeds_part(replaced)))
            stated.append((ex.picture_color, ex.favorite_color))
    named = _answers(client, conversations)
    rate = _rate(named, stated)
    picture_read = _rate([n and n[0] for n in named], [s[0] for s in stated])
    print(f"colour row replaced by ' picture': favourite still named in {rate:.1%}, picture's colour in "
          f"{picture_read:.1%}; answers {sorted(set(named), key=str)}")
    assert rate <= 0.25
    assert picture_read >= 0.9, "only the replaced row's meaning is lost; the picture is still read"


def _image_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_http_face_gives_the_same_answers_through_the_openai_sdk(colors_stack, client, held_out, model_dir, tok):
    base_url = f"http://{colors_stack[1].http_address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0) as sdk:
        for ex, pic in held_out[:6]:
            rows = _sentence_rows(model_dir, tok, ex)[1]
            content = []
            for part in ex.messages(pic, _embeds_part(rows))[-1]["content"]:
                if part["type"] == "prompt_embeds":
                    content.append({"type": "prompt_embeds", "data": vllm_base64(rows)})
                elif part["type"] == "image":
                    content.append({"type": "image_url", "image_url": {"url": _image_url(pic)}})
                else:
                    content.append(part)
            messages = ([{"role": "system", "content": colors.SYSTEM}] if ex.system else []) + \
                [{"role": "user", "content": content}]
            reply = sdk.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0,
                                                max_tokens=MAX_TOKENS)
            grpc_answer = ask(client, ex.messages(pic, _embeds_part(rows)), MAX_TOKENS)[0]
            assert reply.choices[0].message.content.strip() == grpc_answer
            assert colors.read_answer(grpc_answer) == (ex.picture_color, ex.favorite_color)


def test_splice_demo_prints_both_answers_naming_the_right_colours(tiny_dirs):
    done = subprocess.run([sys.executable, "-m", "app.cli", "demo"], capture_output=True, text=True, timeout=600,
                          env=os.environ.copy())
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    answers = [line.removeprefix("assistant: ") for line in out.splitlines() if line.startswith("assistant: ")]
    assert len(answers) == 4, out  # the tiny VLM's two, then the real model's two
    assert [colors.read_answer(a) for a in answers[:2]] == [colors.DEMO_PAIR] * 2, out
    assert all("Paris" in a for a in answers[2:]), out
    assert "prompt_embeds" in out and colors.DEMO_FAVORITE.strip() in out, out
    assert out.count("identical answers: yes") == 2, out


def test_a_transparent_picture_is_read_as_white_as_hf_paints_it(colors_stack):
    """A red square on a transparent background whose hidden colour is black: HF (and vLLM) paint transparency
    white, so the picture is white; a plain RGB conversion would show the hidden black."""
    pic = PILImage.new("RGBA", (64, 64), (0, 0, 0, 0))
    pic.paste((230, 20, 20, 255), (28, 28, 36, 36))
    ex = colors.demo_example()
    base_url = f"http://{colors_stack[1].http_address}/v1"
    content = [{"type": "image_url", "image_url": {"url": _image_url(pic)}} if part["type"] == "image" else part
               for part in ex.messages()[-1]["content"]]
    with openai.OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0) as sdk:
        reply = sdk.chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": content}],
                                            temperature=0, max_tokens=MAX_TOKENS)
    assert colors.read_answer(reply.choices[0].message.content) == ("white", ex.favorite_color)


def _sdk_messages(ex: colors.Example, pic) -> list[dict]:
    """`ex` as the HTTP face takes it: the picture as an image_url part (no image part when `pic` is None)."""
    content = [{"type": "image_url", "image_url": {"url": _image_url(pic)}} if part["type"] == "image" else part
               for part in ex.messages()[-1]["content"] if part["type"] != "image" or pic is not None]
    system = [{"role": "system", "content": colors.SYSTEM}] if ex.system else []
    return [*system, {"role": "user", "content": content}]


def test_a_grammar_with_the_picture_keeps_the_trained_answer(colors_stack, held_out):
    """A regex of the answer's shape over the colour names, with the picture in the request: the constrained greedy
    answer names both colours right. Without the picture the same constraint still gives the favourite (from the
    text) but another picture colour: the image reaches the constrained answer. (A bare choice of colour names forces
    an opening the model never learned: it answers "cyan" with or without the picture.)"""
    names = "|".join(colors.NAMES)
    shape = {"regex": rf"The picture is ({names})\. Your favorite color is ({names})\."}
    base_url = f"http://{colors_stack[1].http_address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0) as sdk:
        def ask(ex, pic) -> str:
            reply = sdk.chat.completions.create(model=DEFAULT_MODEL, messages=_sdk_messages(ex, pic), temperature=0,
                                                max_tokens=MAX_TOKENS, extra_body={"structured_outputs": shape})
            assert reply.choices[0].finish_reason == "stop", reply.choices[0]
            return reply.choices[0].message.content

        for ex, pic in held_out[::EXAMPLES_PER_PAIR][:3]:
            assert colors.read_answer(ask(ex, pic)) == (ex.picture_color, ex.favorite_color)
            blind = colors.read_answer(ask(ex, None))
            assert blind[1] == ex.favorite_color and blind[0] != ex.picture_color
