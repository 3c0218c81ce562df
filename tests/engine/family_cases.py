"""One entry per model family served: how to make its inputs the way its own HF processor does, and how
to ask HF itself for the reference. tests/engine/test_families.py runs the same checks on every case.

Adding a family = one FamilyCase here (its tiny model name, and overrides only where HF needs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.engine.engine_factories import picture


def hf_processor(model_dir: Path) -> Any:
    """The model's own HF processor, as the preprocessor loads it (PIL image processors, no torchvision)."""
    from preprocessor.model_files import load_model_files

    return load_model_files(model_dir).processor


def chat_prompt(processor: Any, text: str, images: int) -> str:
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class FamilyCase:
    tiny: str  # tiny model name (app/tiny)
    images: bool = True
    # Prompt embeddings equal to a text's embedding rows give the text's tokens. False where the model also
    # reads the IDs themselves (say why in `equivalence_note`).
    embeds_act_as_text: bool = True
    equivalence_note: str = ""
    picture_size: tuple[int, int] = (70, 45)

    def inputs(self, model_dir: Path, text: str = "What is shown?", images: int = 1,
               shift: int = 0) -> tuple[list[int], dict[str, torch.Tensor]]:
        """(input_ids, {forward keyword: tensor}) exactly as the model's own HF processor makes them."""
        if not self.images:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            msgs = [{"role": "user", "content": text}]
            return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"], {}
        processor = hf_processor(model_dir)
        if images == 0:
            return processor(text=chat_prompt(processor, text, 0), return_tensors="pt")["input_ids"][0].tolist(), {}
        pics = [picture(*self.picture_size, shift=shift + 40 * k) for k in range(images)]
        out = processor(text=chat_prompt(processor, text, images), images=pics, return_tensors="pt")
        tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}
        return out["input_ids"][0].tolist(), tensors

    def hf_generate(self, model: torch.nn.Module, ids: list[int], tensors: dict[str, torch.Tensor],
                    n: int) -> list[int]:
        """HF generate's own greedy continuation (stops at EOS like the engine), the independent reference."""
        with torch.inference_mode():
            mask = torch.ones(1, len(ids), dtype=torch.long)
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=mask, **tensors, max_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    def hf_first_logits(self, model: torch.nn.Module, ids: list[int], embeds: torch.Tensor,
                        tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """HF's forward on the same inputs_embeds [P, hidden] (image positions hold the image token's row, which
        HF replaces with its own features) -> last-position logits [vocab]."""
        with torch.inference_mode():
            return model(inputs_embeds=embeds[None], **tensors).logits[0, -1].float()


CASES: tuple[FamilyCase, ...] = (
    FamilyCase("tiny-text", images=False),
    FamilyCase("tiny-llava"),
    FamilyCase("tiny-idefics3"),
    # Mamba2 + attention + MoE; no vocabulary headroom; HF's generate runs on the Omni model itself
    FamilyCase("tiny-nemotron-omni"),
)
