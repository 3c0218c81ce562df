"""The seed scenario: one conversation mixing text, prompt embeddings, an image and more text."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from safetensors import safe_open


def sample_picture(width: int = 96, height: int = 64) -> Image.Image:
    """A generated picture: a gradient with a circle and a bar, different in every quadrant."""
    img = Image.new("RGB", (width, height))
    img.putdata([(x * 255 // width, y * 255 // height, 128) for y in range(height) for x in range(width)])
    draw = ImageDraw.Draw(img)
    draw.ellipse((width // 8, height // 8, width // 2, height * 3 // 4), fill=(250, 200, 20))
    draw.rectangle((width * 5 // 8, height // 4, width * 7 // 8, height * 3 // 4), fill=(20, 40, 220))
    return img


def embedding_rows(model_dir: str | Path, token_ids: list[int]) -> torch.Tensor:
    """Rows of the model's own input embedding table for `token_ids`: [len(token_ids), hidden]."""
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if key.endswith("embed_tokens.weight"):
                    return f.get_slice(key)[:][token_ids].clone()
    raise FileNotFoundError(f"no embed_tokens.weight in {model_dir}")


def seed_conversation(model_dir: str | Path) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    phrase_ids = tok("a small picture of shapes", add_special_tokens=False).input_ids
    embeds = embedding_rows(model_dir, phrase_ids)  # [n, hidden]
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [
            {"type": "text", "text": "Here is a soft prompt: "},
            {"type": "prompt_embeds", "prompt_embeds": embeds},
            {"type": "text", "text": " and a picture:"},
            {"type": "image", "image": sample_picture()},
            {"type": "text", "text": "Describe the picture in one sentence."},
        ]},
    ]


def describe(messages: list[dict]) -> str:
    """One line per message: its role and the kinds (and sizes) of its parts."""
    lines = []
    for m in messages:
        if isinstance(m["content"], str):
            parts = [repr(m["content"])]
        else:
            parts = [repr(p["text"]) if p["type"] == "text" else
                     f"<prompt_embeds {list(p['prompt_embeds'].shape)}>" if p["type"] == "prompt_embeds" else
                     f"<image {p['image'].size[0]}x{p['image'].size[1]}>" for p in m["content"]]
        lines.append(f"{m['role']}: " + " ".join(parts))
    return "\n".join(lines)


def run_demo(model: str, max_tokens: int = 24) -> int:
    from app.launch import start_stack
    from app.models import noise_note, resolve_model
    from clients import SpliceClient

    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    model_dir = resolve_model(model, progress=say)
    if note := noise_note(model):
        say(note)
    say("starting engine and preprocessor ...")
    engine, pre = start_stack(model, echo=say)
    try:
        say(f"engine on {engine.address}, preprocessor on {pre.address}")
        messages = seed_conversation(model_dir)
        print(describe(messages))
        with SpliceClient(pre.address, timeout=300) as client:
            print("assistant: ", end="", flush=True)
            usage = finish = None
            for chunk in client.chat(messages, temperature=0.0, max_tokens=max_tokens):
                print(chunk.text, end="", flush=True)
                usage, finish = chunk.usage or usage, chunk.finish_reason or finish
            print()
        print(f"finish_reason={finish} prompt_tokens={usage.prompt_tokens} "
              f"completion_tokens={usage.completion_tokens}")
        return 0
    finally:
        pre.stop()
        engine.stop()
