"""PIL image processors Splice provides where transformers has only a torchvision one.

`SUBSTITUTES` maps the `image_processor_type` a checkpoint's preprocessor_config.json names to the class that
makes the same tensors from PIL/NumPy; preprocessor/model_files.py builds the processor from its parts with it.
"""

from __future__ import annotations

from preprocessor.pil_image_processors.lfm2_vl import Lfm2VlImageProcessorPil
from preprocessor.pil_image_processors.nemotron_omni import NemotronH_Omni_Reasoning_V3ImageProcessorPil

SUBSTITUTES: dict[str, type] = {
    "Lfm2VlImageProcessor": Lfm2VlImageProcessorPil,
    "Lfm2VlImageProcessorFast": Lfm2VlImageProcessorPil,  # the name older LFM2-VL checkpoints were saved with
    "NemotronH_Omni_Reasoning_V3ImageProcessor": NemotronH_Omni_Reasoning_V3ImageProcessorPil,
}

__all__ = ["SUBSTITUTES", "Lfm2VlImageProcessorPil", "NemotronH_Omni_Reasoning_V3ImageProcessorPil"]
