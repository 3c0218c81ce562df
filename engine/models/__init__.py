"""Model families: one file per HF architecture family, on the contract in base.py, each the class that runs a
family declared in splice/families.py (which model_types it serves lives there).

Adding a family: the files docs/engine.md lists under "Families".
"""

from __future__ import annotations

from typing import Any

from engine.models.base import ModelFamily, Prompt, StepInputs
from engine.models.gemma3 import Gemma3
from engine.models.gemma4 import Gemma4
from engine.models.idefics3 import Idefics3
from engine.models.lfm2_vl import Lfm2Vl
from engine.models.llava import Llava
from engine.models.llava_onevision import LlavaOnevision
from engine.models.nemotron_h import NemotronH
from engine.models.qwen2_vl import Qwen2VL
from engine.models.qwen3_5 import Qwen3_5
from splice.errors import FailedPrecondition
from splice.families import TEXT, by_model_type, served_model_types

# family declaration (splice/families.py, by name) -> the class that runs it
FAMILIES: dict[str, type[ModelFamily]] = {
    "text": ModelFamily,
    "llava": Llava,
    "idefics3": Idefics3,
    "gemma3": Gemma3,
    "gemma4": Gemma4,
    "qwen2_vl": Qwen2VL,
    "qwen3_5": Qwen3_5,
    "lfm2_vl": Lfm2Vl,
    "llava_onevision": LlavaOnevision,
    "nemotron_h": NemotronH,
}


def family_for(config: Any) -> type[ModelFamily]:
    """The family serving `config`; the plain decoder-only default for text models of any model_type."""
    model_type = getattr(config, "model_type", "")
    declared = by_model_type(model_type)
    if declared is None and getattr(config, "vision_config", None) is not None:
        raise FailedPrecondition(f"vision model type {model_type!r} is not supported; served: "
                                 f"{served_model_types()}")
    return FAMILIES[(declared or TEXT).name]


__all__ = ["FAMILIES", "ModelFamily", "Prompt", "StepInputs", "family_for"]
