"""The seed scenario, a conversation of text, prompt embeddings that say the user's favourite colour, a
picture, a question asking for both. Asked again with the sentence as plain text: prompt embeddings equal to a
text's embedding rows must act as that text, so on the trained default model both answers name both colours."""

from __future__ import annotations

import base64
import io
import random
import sys
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from safetensors import safe_open

from app.tiny import colors
from splice.v1 import preprocessor_pb2 as pp

DEMO_PICTURE_SEED = 2024


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


def vllm_base64(tensor: torch.Tensor) -> str:
    """vLLM's prompt_embeds encoding: base64 of torch.save(tensor)."""
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return base64.b64encode(buf.getvalue()).decode()


def demo_picture() -> Image.Image:
    """A generated picture of mostly the demo's colour, unlike any the model was trained on (its own seed)."""
    return colors.picture(colors.DEMO_PAIR[0], random.Random(DEMO_PICTURE_SEED))


def seed_conversation(model_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """The colour conversation twice: with the favourite-colour sentence as a prompt_embeds part (the rows of
    the model's own embedding table for its tokens, in vLLM's encoding), and as plain text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    example = colors.demo_example()
    ids = tok(example.favorite_text, add_special_tokens=False).input_ids
    embeds = embedding_rows(model_dir, ids)  # [n, hidden]
    part = {"type": "prompt_embeds", "prompt_embeds": pp.PromptEmbeds(torch_base64=vllm_base64(embeds)),
            "shape": list(embeds.shape), "says": example.favorite_text}
    image = demo_picture()
    return example.messages(image, favorite_part=part), example.messages(image)


def describe(messages: list[dict]) -> str:
    """One line per message: its role and the kinds (and sizes) of its parts."""
    def part(p: dict) -> str:
        if p["type"] == "text":
            return repr(p["text"])
        if p["type"] == "prompt_embeds":
            return f"<prompt_embeds {p['shape']}, vLLM base64, the rows of {p['says']!r}>"
        return f"<image {p['image'].size[0]}x{p['image'].size[1]}>"

    return "\n".join(f"{m['role']}: " + (repr(m["content"]) if isinstance(m["content"], str) else
                                         " ".join(part(p) for p in m["content"])) for m in messages)


def _sendable(messages: list[dict]) -> list[dict]:
    """The messages as the client takes them: a prompt_embeds part as its protobuf (the torch_base64 form)."""
    def part(p: dict) -> dict | pp.ContentPart:
        return pp.ContentPart(prompt_embeds=p["prompt_embeds"]) if p["type"] == "prompt_embeds" else p

    return [m if isinstance(m["content"], str) else {**m, "content": [part(p) for p in m["content"]]}
            for m in messages]


def ask(client, messages: list[dict], max_tokens: int) -> tuple[str, object, str]:
    """(answer, usage, finish reason) for one greedy chat."""
    text, usage, finish = "", None, None
    for chunk in client.chat(_sendable(messages), temperature=0.0, max_tokens=max_tokens):
        text += chunk.text
        usage, finish = chunk.usage or usage, chunk.finish_reason or finish
    return text.strip(), usage, finish


REAL_QUESTION = "What is the capital of France?"
REAL_TAIL_TOKENS = 3  # " of France?": the question's last tokens go as prompt embeddings


def real_conversation(model_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """A question to the real model twice: its tail as a prompt_embeds part (the model's own rows for its tokens),
    and as plain text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(REAL_QUESTION, add_special_tokens=False).input_ids
    head, tail = ids[:-REAL_TAIL_TOKENS], ids[-REAL_TAIL_TOKENS:]
    embeds = embedding_rows(model_dir, tail)  # [3, hidden]
    part = {"type": "prompt_embeds", "prompt_embeds": pp.PromptEmbeds(torch_base64=vllm_base64(embeds)),
            "shape": list(embeds.shape), "says": tok.decode(tail)}
    as_embeds = [{"role": "user", "content": [{"type": "text", "text": tok.decode(head)}, part]}]
    return as_embeds, [{"role": "user", "content": [{"type": "text", "text": REAL_QUESTION}]}]


def run_demo(model: str, max_tokens: int = 24, real_model: str | None = None) -> int:
    """The colour conversation on `model`, then (unless `real_model` is None) a question to the real model."""
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    _both_ways(model, seed_conversation, max_tokens, say, header=(
        f"Text, prompt embeddings, an image, text (a generated, mostly {colors.DEMO_PAIR[0]} picture); the "
        f"favourite-colour sentence is sent as prompt embeddings:"),
        text_header="The same question with the sentence as plain text:")
    if real_model is None:
        return 0
    from app.models import resolve_model
    from splice.errors import SpliceError

    print()
    try:
        resolve_model(real_model, progress=say)
    except SpliceError as exc:  # offline on first use: the first part stands on its own
        print(f"The real-model part is skipped: {exc}")
        return 0
    _both_ways(real_model, real_conversation, max_tokens, say, header=(
        f"The real model ({real_model}), a question whose tail is sent as prompt embeddings (the model's own rows; "
        f"its vocabulary has no spare row, so the placeholder's ID lies past the table):"),
        text_header="The same question as plain text:")
    return 0


def _both_ways(model: str, conversation, max_tokens: int, say, header: str, text_header: str) -> tuple[str, str]:
    """Start a stack on `model`, ask `conversation(model_dir)`'s two forms, print both answers and whether they
    are the same."""
    from app.launch import start_stack
    from app.models import model_note, resolve_model
    from clients import SpliceClient

    model_dir = resolve_model(model, progress=say)
    if note := model_note(model):
        say(note)
    say(f"starting engine and preprocessor on {model} ...")
    engine, pre = start_stack(model, echo=say)
    try:
        say(f"engine on {engine.address}, preprocessor on {pre.address}")
        as_embeds, as_text = conversation(model_dir)
        print(header)
        print(describe(as_embeds))
        with SpliceClient(pre.address, timeout=300) as client:
            answer, usage, finish = ask(client, as_embeds, max_tokens)
            print(f"assistant: {answer}")
            print(f"finish_reason={finish} prompt_tokens={usage.prompt_tokens} "
                  f"completion_tokens={usage.completion_tokens}")
            print()
            print(text_header)
            print(describe(as_text))
            plain, _, _ = ask(client, as_text, max_tokens)
            print(f"assistant: {plain}")
        print()
        print(f"identical answers: {'yes' if answer == plain else 'no'}")
        return answer, plain
    finally:
        pre.stop()
        engine.stop()
