"""Model families: one file per HF architecture family, on the contract in base.py.

Adding a family = one file here + its entry in FAMILIES + its tiny builder (app/tiny/families/, listed in
app/tiny/builder.py) + its tests.
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

FAMILIES: tuple[type[ModelFamily], ...] = (Llava, Idefics3, Gemma3, Gemma4, Qwen2VL, Qwen3_5, Lfm2Vl, LlavaOnevision,
                                                NemotronH)


def family_for(config: Any) -> type[ModelFamily]:
    """The family serving `config`; the plain decoder-only default for text models of any model_type."""
    model_type = getattr(config, "model_type", "")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    if getattr(config, "vision_config", None) is not None:
        served = sorted(t for f in FAMILIES for t in f.model_types)
        raise FailedPrecondition(f"vision model type {model_type!r} is not supported; served: {served}")
    return ModelFamily


__all__ = ["FAMILIES", "ModelFamily", "Prompt", "StepInputs", "family_for"]
