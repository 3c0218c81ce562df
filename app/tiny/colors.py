"""The synthetic colour task the trained tiny VLM learns: a picture of mostly one colour, a sentence stating the
user's favourite colour, a question asking for both; the answer names both.

Conversations are content-part lists in the shape the preprocessor takes (text, image, prompt_embeds), so the
trainer, the tests and the demo share one definition. The favourite-colour sentence is always its own text part
and never the first one: the template joins parts without separators, so the sentence starts with a space and
tokenizes the same alone as inside the prompt, which is what lets its embedding rows stand in for it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

# name -> RGB, a dozen colours far enough apart that a frozen random vision tower still separates them.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 60, 220), "yellow": (240, 220, 30),
    "black": (15, 15, 15), "white": (245, 245, 245), "orange": (245, 140, 20), "purple": (130, 40, 170),
    "pink": (245, 150, 200), "brown": (120, 70, 30), "gray": (128, 128, 128), "cyan": (40, 210, 220),
}
NAMES = list(COLORS)

# (picture colour, favourite colour) pairs never shown in training: each colour twice as the picture and twice as
# the favourite, at two offsets. The demo's pair (blue, purple) is one of them.
HELD_OUT: frozenset[tuple[str, str]] = frozenset(
    (NAMES[i], NAMES[(i + k) % len(NAMES)]) for i in range(len(NAMES)) for k in (5, 8))
TRAIN_PAIRS = [(p, f) for p in NAMES for f in NAMES if (p, f) not in HELD_OUT]

# {c}: the colour word, {C}: capitalized. The colour sits at the end, in the middle, or first.
FAVORITE = [
    "My favorite color is {c}.",
    "The color is {c}.",
    "{C} is my favorite color.",
    "I like {c} more than any other color.",
    "My favourite colour is {c}.",
    "I love the color {c}.",
]
QUESTIONS = [
    "Please describe the image to me. Then tell me my favorite color.",
    "What color is the picture, and what is my favorite color?",
    "Describe the picture and tell me my favorite color.",
    "What do you see in the image? Also, which color do I like best?",
]
PREFACES = ["Hello!", "I have a favorite color.", "Here is a picture.", "Remember this.", "Hi, a quick question."]
SYSTEM = "You are a helpful assistant."
ANSWER = "The picture is {p}. Your favorite color is {f}."
_ANSWER_RE = re.compile(r"The picture is (\w+)\. Your favorite color is (\w+)\.")

# The report's conversation: a preface, the favourite colour (sent as embeddings in the demo), a picture, the
# question.
DEMO_PAIR = ("blue", "purple")
DEMO_PREFACE = "I have a favorite color."
DEMO_FAVORITE = " The color is purple."
DEMO_QUESTION = " Please describe the image to me. Then tell me my favorite color."


def favorite_sentence(template: str, color: str) -> str:
    """The sentence as it appears in the prompt: with its leading space (it never opens a message)."""
    return " " + template.format(c=color, C=color.capitalize())


def answer(picture: str, favorite: str) -> str:
    return ANSWER.format(p=picture, f=favorite)


def read_answer(text: str) -> tuple[str, str] | None:
    """(picture colour, favourite colour) named by an answer, or None when it has not the answer's shape."""
    m = _ANSWER_RE.search(text)
    return (m.group(1), m.group(2)) if m else None


def picture(color: str, rng: random.Random) -> Image.Image:
    """Mostly `color`: a shaded, slightly noisy field of a random size, sometimes with a small shape of another
    colour (at most about a sixth of the area)."""
    w, h = rng.randint(24, 96), rng.randint(24, 96)
    base = [min(255, max(0, v + rng.randint(-18, 18))) for v in COLORS[color]]
    noise = rng.randint(0, 12)
    pixels = [tuple(min(255, max(0, v + rng.randint(-noise, noise))) for v in base) for _ in range(64)]
    img = Image.new("RGB", (w, h))
    img.putdata([pixels[rng.randrange(64)] for _ in range(w * h)])
    if rng.random() < 0.5:
        other = COLORS[rng.choice([c for c in NAMES if c != color])]
        sw, sh = rng.randint(w // 6, w // 3), rng.randint(h // 6, h // 3)
        x, y = rng.randint(0, w - sw), rng.randint(0, h - sh)
        shape = ImageDraw.Draw(img).ellipse if rng.random() < 0.5 else ImageDraw.Draw(img).rectangle
        shape((x, y, x + sw, y + sh), fill=other)
    return img


@dataclass(frozen=True)
class Example:
    """One conversation of the task. `content` holds the favourite sentence as the text part at `favorite_at`."""

    picture_color: str
    favorite_color: str
    system: bool  # a system message first
    content: tuple[dict, ...]  # the user message's parts; the image part's "image" is None until filled
    favorite_at: int

    @property
    def answer(self) -> str:
        return answer(self.picture_color, self.favorite_color)

    @property
    def favorite_text(self) -> str:
        return self.content[self.favorite_at]["text"]

    def messages(self, image: Image.Image | None = None, favorite_part: dict | None = None) -> list[dict]:
        """The conversation with `image` in its image part and, when given, `favorite_part` (e.g. a prompt_embeds
        part) in place of the favourite sentence."""
        parts = []
        for i, part in enumerate(self.content):
            if part["type"] == "image":
                part = {"type": "image", "image": image}
            elif i == self.favorite_at and favorite_part is not None:
                part = favorite_part
            parts.append(part)
        user = {"role": "user", "content": parts}
        return ([{"role": "system", "content": SYSTEM}] if self.system else []) + [user]


def example(picture_color: str, favorite_color: str, rng: random.Random) -> Example:
    """A conversation in one of the task's shapes: preface / favourite / image / question in varied orders."""
    favorite = favorite_sentence(rng.choice(FAVORITE), favorite_color)
    question = rng.choice(QUESTIONS)
    order = rng.choice([
        ("preface", "favorite", "image", "question"),  # the report's order
        ("image", "question", "favorite"),
        ("preface", "image", "favorite", "question"),
        ("question", "image", "favorite"),
        ("image", "favorite", "question"),
        ("question", "favorite", "image"),
    ])
    parts: list[dict] = []
    for piece in order:
        if piece == "image":
            parts.append({"type": "image", "image": None})
        elif piece == "favorite":
            parts.append({"type": "text", "text": favorite})
        else:
            text = rng.choice(PREFACES) if piece == "preface" else question
            # Every text part but a message's first starts with a space; the first follows the template's ": ".
            parts.append({"type": "text", "text": text if not parts else " " + text})
    return Example(picture_color, favorite_color, rng.random() < 0.3, tuple(parts), order.index("favorite"))


def demo_example() -> Example:
    parts = ({"type": "text", "text": DEMO_PREFACE}, {"type": "text", "text": DEMO_FAVORITE},
             {"type": "image", "image": None}, {"type": "text", "text": DEMO_QUESTION})
    return Example(*DEMO_PAIR, system=False, content=parts, favorite_at=1)


def corpus() -> str:
    """The task's text, added to the trained model's tokenizer corpus so that its words are whole tokens."""
    lines = [SYSTEM, *PREFACES, *QUESTIONS]
    for c in NAMES:
        lines += [favorite_sentence(t, c) for t in FAVORITE] + [answer(c, c)]
    return "\n".join(lines) + "\n"
