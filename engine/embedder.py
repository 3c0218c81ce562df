"""A validated request -> its prompt's input embeddings (DESIGN.md engine steps 2-3).

Lookup of every ID, vision features at image-token positions (in order), then supplied rows at their
spans. Span positions hold a filler ID whose looked-up row is overwritten, never used.
"""

from __future__ import annotations

import torch

from engine.loader import LoadedModel
from splice.engine_request import EngineRequest


@torch.inference_mode()
def prompt_embeddings(m: LoadedModel, req: EngineRequest) -> torch.Tensor:
    """[prompt_len, hidden] embeddings of `req` on m.device in m.dtype."""
    ids = torch.tensor(req.token_ids, dtype=torch.long, device=m.device)  # [prompt_len]
    embeds = m.embed(ids).to(m.dtype)  # [prompt_len, hidden]
    covered = torch.zeros(len(ids), dtype=torch.bool, device=m.device)
    for span in req.embed_spans:
        covered[span.offset:span.offset + span.length] = True
    inputs = req.model_inputs
    if inputs and m.vision is not None:
        feats = m.vision.features(m.model, inputs, m.dtype, m.device)  # [image_rows, hidden]
        image_mask = (ids == m.info.image_token_id) & ~covered  # [prompt_len]
        embeds[image_mask] = feats.to(m.dtype)
    for span in req.embed_spans:
        rows = req.span_rows(span).to(device=m.device, dtype=m.dtype)  # [length, hidden]
        embeds[span.offset:span.offset + span.length] = rows
    return embeds
