"""The model families Splice serves, one declaration each: what every part of Splice needs to know about a family,
as plain data. The engine maps a declaration to the class that runs it (engine/models/__init__.py `FAMILIES`); the
preprocessor reads the processor classes it covers, the geometry its image_embeds carry, the mm_processor_kwargs a
request may set and the image processors it substitutes; app/tiny builds its tiny models.

Adding a family touches the files docs/engine.md lists under "Families"; tests/test_family_registry.py fails while
one of them lacks the family's entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FamilySpec:
    name: str  # engine/models/<name>.py (text: base.py's ModelFamily) and app/tiny/families/<name>.py
    model_types: tuple[str, ...]  # config.model_type values the engine serves with it
    tiny: tuple[str, ...]  # its built-in tiny models (app/tiny/builder.py)
    processors: tuple[str, ...] = ()  # HF processor classes of its checkpoints; none: text only
    # how an image_embeds part carries its image's geometry: a key of GEOMETRIES in preprocessor/embeds_geometry.py
    geometry: str | None = None
    mm_kwargs: tuple[str, ...] = ()  # the mm_processor_kwargs a request may set (preprocessor/mm_kwargs.py CHECKS)
    # image_processor_type values whose transformers class needs torchvision: Splice's own PIL class stands in
    # (preprocessor/pil_image_processors SUBSTITUTES, by family name)
    torchvision_image_processors: tuple[str, ...] = ()


_QWEN_VL_KWARGS = ("min_pixels", "max_pixels")

# Any decoder-only *ForCausalLM that no other family declares: prompt embeddings, no images.
TEXT = FamilySpec("text", (), ("tiny-text", "tiny-text-bos"))

FAMILIES: tuple[FamilySpec, ...] = (
    TEXT,
    FamilySpec("llava", ("llava",), ("tiny-llava",), processors=("LlavaProcessor",), geometry="fixed"),
    FamilySpec("idefics3", ("idefics3", "smolvlm"), ("tiny-idefics3", "tiny-idefics3-colors", "tiny-smolvlm"),
               processors=("Idefics3Processor", "SmolVLMProcessor"), geometry="tiles",
               mm_kwargs=("do_image_splitting",)),
    FamilySpec("gemma3", ("gemma3", "gemma3_text"), ("tiny-gemma3",), processors=("Gemma3Processor",),
               geometry="crops"),
    FamilySpec("gemma4", ("gemma4",), ("tiny-gemma4",), processors=("Gemma4Processor",), geometry="soft_tokens"),
    FamilySpec("qwen2_vl", ("qwen2_vl", "qwen2_5_vl"), ("tiny-qwen2-vl", "tiny-qwen2.5-vl"),
               processors=("Qwen2VLProcessor", "Qwen2_5_VLProcessor"), geometry="patch_grid",
               mm_kwargs=_QWEN_VL_KWARGS),
    FamilySpec("qwen3_5", ("qwen3_5",), ("tiny-qwen3.5",), processors=("Qwen3VLProcessor",), geometry="patch_grid",
               mm_kwargs=_QWEN_VL_KWARGS),
    FamilySpec("lfm2_vl", ("lfm2_vl",), ("tiny-lfm2-vl",), processors=("Lfm2VlProcessor",), geometry="smart_tiles",
               # Lfm2VlImageProcessorFast: the name older LFM2-VL checkpoints were saved with
               torchvision_image_processors=("Lfm2VlImageProcessor", "Lfm2VlImageProcessorFast")),
    FamilySpec("llava_onevision", ("llava_onevision",), ("tiny-llava-onevision",),
               processors=("LlavaOnevisionProcessor",), geometry="any_res"),
    FamilySpec("nemotron_h", ("nemotron_h_omni", "nemotron_h"), ("tiny-nemotron-omni",),
               processors=("NemotronH_Omni_Reasoning_V3Processor",), geometry="hw_grid",
               torchvision_image_processors=("NemotronH_Omni_Reasoning_V3ImageProcessor",)),
)


def by_model_type(model_type: str) -> FamilySpec | None:
    """The family declaring `model_type`; None for any other (a text model, or a vision model not served)."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def by_processor(processor_class: str) -> FamilySpec | None:
    """The family whose checkpoints have processors of class `processor_class`."""
    return next((f for f in FAMILIES if processor_class in f.processors), None)


def by_image_processor(image_processor_type: str) -> FamilySpec | None:
    """The family that substitutes its own PIL class for `image_processor_type` (a torchvision-only one)."""
    return next((f for f in FAMILIES if image_processor_type in f.torchvision_image_processors), None)


def served_model_types() -> list[str]:
    return sorted(t for f in FAMILIES for t in f.model_types)
