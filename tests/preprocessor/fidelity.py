"""What the fidelity tests (test_fidelity_*.py) share: their conversations, HF's own processor's IDs for one, and
the check that prompt_embeds spans leave every other ID as HF's."""

from __future__ import annotations

import io

from PIL import Image as PILImage

from preprocessor.core import PreprocessorCore
from preprocessor.normalize import Normalized
from tests.preprocessor.pp_factories import conversation, png_bytes, rows

IMG_A, IMG_B = png_bytes(70, 45), png_bytes(30, 60, seed=5)

CONVERSATIONS = {
    "text": [("user", "What is the capital of France?")],
    "multi_turn": [("system", "Answer briefly."), ("user", "Hi!"), ("assistant", "Hello. How can I help?"),
                   ("user", "Tell me a joke.")],
    "image": [("user", [IMG_A, "Describe this image."])],
    "two_images": [("user", [IMG_A, "and", IMG_B, "What differs?"]), ("assistant", "Colors."),
                   ("user", ["Explain more."])],
}


def hf_ids(proc, turns) -> list[int]:
    """The IDs HF's processor `proc` makes of `turns` ((role, text or parts) pairs); prompt_embeds parts have no
    HF counterpart: dropped."""
    def parts(ps):
        return [{"type": "image"} if isinstance(p, bytes) else {"type": "text", "text": p}
                for p in ps if isinstance(p, bytes | str)]

    messages = [{"role": r, "content": parts([p] if isinstance(p, str) else p)} for r, p in turns]
    images = [PILImage.open(io.BytesIO(p)).convert("RGB") for _, ps in turns if not isinstance(ps, str)
              for p in ps if isinstance(p, bytes)]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    return proc(text=text, images=images or None, return_tensors="pt")["input_ids"][0].tolist()


def check_embeds_outside_the_spans(core: PreprocessorCore, proc, hidden: int) -> Normalized:
    """An image and two prompt_embeds parts (3 and 7 rows): each sentinel stands for its rows in the raw IDs, the
    spans cover them, and the IDs outside the spans equal HF's for the conversation without them."""
    a, b = rows(3, hidden, seed=1), rows(7, hidden, seed=2)
    turns = [("system", "Answer briefly."), ("user", [IMG_A, "Compare ", a, " and ", b, " please."])]
    norm = core.normalize_chat(conversation(*turns))
    req = norm.request
    s0, s1 = core.files.sentinels.ids[:2]
    assert (norm.raw_ids.count(s0), norm.raw_ids.count(s1)) == (3, 7)
    drop = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
    assert [s.length for s in req.embed_spans] == [3, 7]
    outside = [t for i, t in enumerate(req.token_ids) if i not in drop]
    assert outside == hf_ids(proc, turns)
    return norm
