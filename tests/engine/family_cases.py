"""One entry per model family served: how to make its inputs the way its own HF processor does, and how
to ask HF itself for the reference. tests/engine/test_families.py runs the same checks on every case.

A new family gets one FamilyCase here (its tiny model name, and overrides only where HF needs them); the other
files it touches are listed in docs/engine.md, "Families".
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


TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


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
               shift: int = 0, shifts: tuple[int, ...] | None = None) -> tuple[list[int], dict[str, torch.Tensor]]:
        """(input_ids, {forward keyword: tensor}) exactly as the model's own HF processor makes them; picture k is
        drawn with shift + 40 * k, or with shifts[k] where given (equal shifts: the same picture)."""
        if shifts is not None:
            images = len(shifts)
        if not self.images:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            msgs = [{"role": "user", "content": text}]
            return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"], {}
        processor = hf_processor(model_dir)
        if images == 0:
            return processor(text=chat_prompt(processor, text, 0), return_tensors="pt")["input_ids"][0].tolist(), {}
        shifts = shifts if shifts is not None else tuple(shift + 40 * k for k in range(images))
        pics = [picture(*self.picture_size, shift=s) for s in shifts]
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
        return self.hf_logits(model, ids, embeds, tensors)[-1]

    def hf_logits(self, model: torch.nn.Module, ids: list[int], embeds: torch.Tensor,
                  tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """As hf_first_logits, every position's: [P, vocab]."""
        with torch.inference_mode():
            return model(inputs_embeds=embeds[None], **tensors).logits[0].float()


def image_token_types(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[1, P] long: 1 at image soft tokens, the `token_type_ids` Gemma 3's processor returns beside the IDs."""
    return (torch.tensor([ids]) == model.config.image_token_id).long()


@dataclass(frozen=True)
class Gemma3Case(FamilyCase):
    """HF's bidirectional attention inside each image comes from `token_type_ids`: pass them as its processor does."""

    def hf_generate(self, model: torch.nn.Module, ids: list[int], tensors: dict[str, torch.Tensor],
                    n: int) -> list[int]:
        return super().hf_generate(model, ids, {**tensors, "token_type_ids": image_token_types(model, ids)}, n)

    def hf_logits(self, model: torch.nn.Module, ids: list[int], embeds: torch.Tensor,
                  tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return super().hf_logits(model, ids, embeds, {**tensors, "token_type_ids": image_token_types(model, ids)})


@dataclass(frozen=True)
class Gemma4Case(FamilyCase):
    """Gemma 4 reads the IDs as well as the rows (per-layer inputs): HF's forward from inputs_embeds needs them."""

    def hf_logits(self, model: torch.nn.Module, ids: list[int], embeds: torch.Tensor,
                  tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """HF's forward on the same inputs_embeds and the per-layer inputs of the same IDs, with the pad at image
        positions as HF's own forward from input_ids puts it (span positions hold the preprocessor's filler)."""
        text = torch.tensor(ids)
        text = torch.where(text == model.config.image_token_id, model.config.text_config.pad_token_id, text)
        with torch.inference_mode():
            per_layer = model.model.language_model.get_per_layer_inputs(text[None])
            return model(inputs_embeds=embeds[None], per_layer_inputs=per_layer, **tensors).logits[0].float()


@dataclass(frozen=True)
class MRopeCase(FamilyCase):
    """Qwen2-VL, Qwen2.5-VL, Qwen3.5: HF computes M-RoPE positions from the IDs and mm_token_type_ids (image = 1), which
    the processor makes and Splice derives from the image-token positions instead."""

    @staticmethod
    def _types(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
        return (torch.tensor([ids]) == model.config.image_token_id).long()  # [1, P]

    def hf_generate(self, model: torch.nn.Module, ids: list[int], tensors: dict[str, torch.Tensor],
                    n: int) -> list[int]:
        extra = {"mm_token_type_ids": self._types(model, ids)} if tensors else {}
        return super().hf_generate(model, ids, {**tensors, **extra}, n)

    def hf_logits(self, model: torch.nn.Module, ids: list[int], embeds: torch.Tensor,
                  tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        positions, _ = model.model.get_rope_index(torch.tensor([ids]), self._types(model, ids),
                                                  image_grid_thw=tensors.get("image_grid_thw"))  # [3, 1, P]
        with torch.inference_mode():
            return model(inputs_embeds=embeds[None], position_ids=positions, **tensors).logits[0].float()


CASES: tuple[FamilyCase, ...] = (
    FamilyCase("tiny-text", images=False),
    FamilyCase("tiny-llava"),
    FamilyCase("tiny-idefics3"),
    Gemma3Case("tiny-gemma3"),
    Gemma4Case("tiny-gemma4", embeds_act_as_text=False, equivalence_note=(
        "Gemma 4 adds per-layer inputs looked up from the token IDs, and positions with supplied rows take the pad "
        "ID's, so a text's rows sent as prompt_embeds are not the text. What holds instead (tests/engine/"
        "test_gemma4.py): the engine equals HF's forward and greedy continuation given the same inputs_embeds and "
        "the same IDs with the pad at the supplied positions.")),
    MRopeCase("tiny-qwen2-vl"),
    MRopeCase("tiny-qwen2.5-vl"),
    MRopeCase("tiny-qwen3.5"),
    FamilyCase("tiny-lfm2-vl"),
    FamilyCase("tiny-llava-onevision"),
    FamilyCase("tiny-smolvlm"),
    # Mamba2 + attention + MoE; no vocabulary headroom; HF's generate runs on the Omni model itself
    FamilyCase("tiny-nemotron-omni"),
)
