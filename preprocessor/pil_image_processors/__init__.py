"""PIL image processors Splice provides where transformers has only a torchvision one.

`SUBSTITUTES` maps a family (splice/families.py) to the class that makes the same tensors from PIL/NumPy for the
`image_processor_type` names it declares in `torchvision_image_processors`; preprocessor/processor_parts.py builds
the processor from its parts with it.
"""

from __future__ import annotations

from preprocessor.pil_image_processors.lfm2_vl import Lfm2VlImageProcessorPil
from preprocessor.pil_image_processors.nemotron_omni import NemotronH_Omni_Reasoning_V3ImageProcessorPil
from splice.families import by_image_processor

SUBSTITUTES: dict[str, type] = {
    "lfm2_vl": Lfm2VlImageProcessorPil,
    "nemotron_h": NemotronH_Omni_Reasoning_V3ImageProcessorPil,
}


def substitute_for(image_processor_type: str) -> type | None:
    """Splice's PIL class for a checkpoint whose preprocessor_config.json names `image_processor_type`; None where
    transformers' own class serves."""
    declared = by_image_processor(image_processor_type)
    return SUBSTITUTES[declared.name] if declared is not None else None


__all__ = ["SUBSTITUTES", "Lfm2VlImageProcessorPil", "NemotronH_Omni_Reasoning_V3ImageProcessorPil", "substitute_for"]
