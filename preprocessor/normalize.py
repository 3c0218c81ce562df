"""Conversation / Complete prompt -> EngineRequest (docs/architecture.md, "A request in the preprocessor").

Chat: render (part k as sentinel k) -> tokenize through the processor (image expansion, pixel
tensors) -> splice the sentinels (expand each part's, locate all spans, consume) -> validate against the
engine's ModelInfo. Complete uses no sentinels: its IDs and spans are built from the part boundaries directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from preprocessor.admission import charge
from preprocessor.bad_words import with_bad_words
from preprocessor.content import Conversation, Embeds, Image, ImageEmbeds, PromptPart, Text, TokenIds
from preprocessor.embeds import decode_embeds
from preprocessor.images import decode_image, image_cost, open_image
from preprocessor.limits import Limits
from preprocessor.mm_embeds import SuppliedImages, check_allowed, decode_image_embeds
from preprocessor.mm_kwargs import processor_kwargs
from preprocessor.model_files import ModelFiles
from preprocessor.sentinel import FILLER_ID, Span
from preprocessor.template import RenderJob, check_template_policy, render, request_job
from preprocessor.validate import check_embeds_supported, check_images_supported
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.errors import FailedPrecondition, InvalidArgument
from splice.json_depth import MAX_JSON_DEPTH
from splice.model_info import ModelInfo
from splice.request_rules import check_ids, check_length, check_request, check_rows
from splice.sampling import SamplingParams

# Processor outputs that describe the text, not model inputs the engine needs as tensors (the engine derives
# mm_token_type_ids, Qwen2-VL's image-position marks, from the image token itself).
TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})


@dataclass(frozen=True)
class Normalized:
    request: EngineRequest  # what the engine receives
    prompt: str  # rendered template text with sentinels ("" for Complete)
    image_token_counts: tuple[int, ...]  # image-token positions per image (when asked for)
    raw_ids: tuple[int, ...]  # chat: expanded IDs before consumption (sentinels in place); Complete: the IDs


# Template kwargs are caller data the template may print anywhere; nested values are walked this deep: the JSON cap
# (splice/json_depth.py) below the `tools` list's level and its items' scalars, which tools are checked against first.
MAX_KWARGS_DEPTH = MAX_JSON_DEPTH + 2


def kwarg_strings(value: Any, where: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif depth >= MAX_KWARGS_DEPTH:
        raise InvalidArgument(f"{where}: chat_template_kwargs are nested deeper than {MAX_KWARGS_DEPTH} levels")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from kwarg_strings(k, f"{where} (a key)", depth + 1)
            yield from kwarg_strings(v, f"{where}[{k!r}]", depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from kwarg_strings(v, f"{where}[{i}]", depth + 1)


def _check_reserved(conv: Conversation, files: ModelFiles) -> None:
    """Caller strings that reach the rendered prompt may not contain a sentinel or image placeholder."""
    for msg in conv.messages:
        files.check_text(msg.role, f"messages[{msg.index}].role", "role")
        for part in msg.parts:
            if isinstance(part, Text):
                files.check_text(part.text, part.where)
    for key, value in conv.template_kwargs.items():
        for where, text in kwarg_strings(value, f"chat_template_kwargs[{key!r}]"):
            files.check_text(text, where)
    # An override may print image placeholders itself (llava's does), but no sentinel.
    if conv.chat_template:
        files.sentinels.check_text(conv.chat_template, "", "chat_template")


def check_counts(n_images: int, n_embeds: int, info: ModelInfo, files: ModelFiles, limits: Limits,
                  first_image: object = "") -> None:
    if n_images > limits.max_images:
        raise InvalidArgument(f"the request has {n_images} images; at most {limits.max_images}")
    cap = min(limits.max_embeds_parts, files.sentinels.count)  # one sentinel per part
    if n_embeds > cap:
        raise InvalidArgument(f"the request has {n_embeds} prompt_embeds parts; at most {cap}")
    check_images_supported(n_images, info, files.accepts_images, first_image)
    check_embeds_supported(n_embeds, info)


def normalize_chat(conv: Conversation, sampling: SamplingParams, request_id: str, files: ModelFiles,
                   info: ModelInfo, limits: Limits, count_images: bool = False,
                   render_request: Callable[[RenderJob], str] | None = None) -> Normalized:
    """`count_images` fills Normalized.image_token_counts (Tokenize's answer); tiled layouts pay a processor
    run per image for it, so the generation path leaves it off. `render_request` renders the request's own
    template (the sandbox; or a prompt rendered beforehand)."""
    check_template_policy(conv, limits.trust_request_chat_template, limits.max_chat_template_bytes)
    sampling = with_bad_words(sampling, files.tokenizer, files.sentinels)
    images, embeds, supplied = conv.parts(Image), conv.parts(Embeds), conv.parts(ImageEmbeds)
    first = (images or supplied)[0].where if images or supplied else ""
    check_counts(len(images) + len(supplied), len(embeds), info, files, limits, first)
    check_allowed(conv, limits)
    _check_reserved(conv, files)
    mm_kwargs = processor_kwargs(conv.mm_processor_kwargs, files)
    # Every image's header is checked, and the request's pixels together (as large as the processor will resize
    # them up to), before anything is decoded; what decoding them holds is charged to the request's admission first.
    opened = [open_image(p, limits) for p in images]
    min_pixels = mm_kwargs.get("images_kwargs", {}).get("size", {}).get("shortest_edge", 0)
    charge(image_cost(opened, limits, min_pixels), f"decoding the request's {len(opened)} images")
    rows = _decode_all(embeds, info, limits)  # each [n_k, hidden]
    pictures = [decode_image(o, limits) for o in opened]
    features = decode_image_embeds(supplied, files, info, limits) if supplied else None
    if conv.chat_template is None:
        prompt = render(files.tokenizer, files.chat_template, conv, files.image_placeholder, files.sentinels)
    elif render_request is None:
        raise RuntimeError("a request chat template needs render_request")
    else:
        prompt = render_request(request_job(files.tokenizer, conv, files.image_placeholder, files.sentinels))
    if features is None:
        ids, model_inputs = _tokenize(prompt, pictures, files, conv.add_special_tokens, mm_kwargs)
    else:
        ids, model_inputs = _tokenize_supplied(prompt, features, files, info, conv.add_special_tokens)
    if (pictures or features) and info.image_token_id is not None and info.image_token_id not in ids:
        raise FailedPrecondition(f"the processor's image tokens are not the engine's image token "
                                 f"{info.image_token_id}: the preprocessor's --model does not match the engine")
    if features is not None:
        counts = features.rows if count_images else ()
    else:
        counts = _image_token_counts(ids, pictures, info, files, mm_kwargs) if count_images else ()
    # Part k's span is where sentinel k expands, wherever the template put it.
    spliced = files.sentinels.splice(ids, [r.shape[0] for r in rows], [p.where for p in embeds])
    return _finish(spliced.ids, spliced.spans, rows, model_inputs, prompt, counts, tuple(spliced.expanded), sampling,
                   request_id, info)


def normalize_complete(parts: Sequence[PromptPart], sampling: SamplingParams, request_id: str, files: ModelFiles,
                       info: ModelInfo, limits: Limits, add_special_tokens: bool = True) -> Normalized:
    """`add_special_tokens`: a prompt that starts with text gets the tokenizer's special tokens (BOS) there, as
    vLLM's completions do by default; token IDs and prompt embeddings are used as given, and text after another
    part never gets any (it continues the prompt)."""
    if not parts:
        raise InvalidArgument("prompt is empty")
    sampling = with_bad_words(sampling, files.tokenizer, files.sentinels)
    embeds = [p for p in parts if isinstance(p, Embeds)]
    check_counts(0, len(embeds), info, files, limits)
    # No sentinels: a caller's ID may equal a sentinel ID (padded embedding tables), so spans come from the
    # part boundaries and each embeds part holds filler positions.
    ids: list[int] = []
    rows: list[torch.Tensor] = []
    spans: list[Span] = []
    for k, p in enumerate(parts):
        if isinstance(p, TokenIds):
            check_ids(p.ids, info, p.where)
            ids.extend(p.ids)
        elif isinstance(p, Text):
            files.check_text(p.text, p.where)
            ids.extend(files.tokenizer(p.text, add_special_tokens=add_special_tokens and k == 0)["input_ids"])
        else:
            r = decode_embeds(p, info, limits)  # [n, hidden]
            spans.append(Span(len(ids), r.shape[0], len(rows)))
            rows.append(r)
            ids.extend([FILLER_ID] * r.shape[0])
            check_length(len(ids), info, p.where)  # stop decoding further parts: the prompt cannot fit already
    return _finish(ids, spans, rows, {}, "", (), tuple(ids), sampling, request_id, info)


def _decode_all(parts: Sequence[Embeds], info: ModelInfo, limits: Limits) -> list[torch.Tensor]:
    """Decodes parts in order, stopping as soon as their rows alone fill the context: each part is capped
    by itself, and this keeps many parts from adding up to far more than any prompt can hold."""
    rows: list[torch.Tensor] = []
    total = 0
    for p in parts:
        rows.append(decode_embeds(p, info, limits))  # [n, hidden]
        total += rows[-1].shape[0]
        check_rows(total, info, f"{p.where}: the prompt_embeds up to this part")
    return rows


def tokenize_text(text: str, add_special_tokens: bool, files: ModelFiles, info: ModelInfo) -> list[int]:
    files.check_text(text, "text")
    ids = files.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    check_ids(ids, info, "text")
    return ids


def _tokenize(prompt: str, pictures: list, files: ModelFiles, add_special_tokens: bool = False,
              mm_kwargs: dict[str, Any] | None = None,
              processor: Any = None) -> tuple[list[int], dict[str, torch.Tensor]]:
    """`add_special_tokens`: the tokenizer's special tokens on top of the template's (vLLM's chat field).
    `processor`: the one to run instead of the model's (mm_embeds.py's, whose images are geometry)."""
    tok = files.tokenizer
    if files.processor is None:
        # As tokenizer.apply_chat_template(tokenize=True): the template writes any BOS itself.
        return tok(prompt, add_special_tokens=add_special_tokens)["input_ids"], {}
    kwargs: dict[str, Any] = dict(mm_kwargs or {}) if pictures else {}
    if add_special_tokens:
        kwargs["add_special_tokens"] = True
    elif tok.bos_token is not None and prompt.startswith(tok.bos_token):
        kwargs["add_special_tokens"] = False  # as processor.apply_chat_template: no second BOS
    # A stood-in image processor's outputs are no tensors to convert: its IDs come back as lists.
    tensor_type = "pt" if processor is None else None
    try:
        out = (processor or files.processor)(text=prompt, images=pictures or None, return_tensors=tensor_type,
                                             **kwargs)
    except ValueError as exc:  # e.g. placeholder count != image count
        raise InvalidArgument(f"the processor refused the rendered prompt: {exc}") from None
    ids = out["input_ids"]  # [1, seq_len]
    tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}
    return list(ids[0]) if processor is not None else ids[0].tolist(), tensors


def _tokenize_supplied(prompt: str, features: SuppliedImages, files: ModelFiles, info: ModelInfo,
                       add_special_tokens: bool) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The prompt's IDs with each image_embeds part's placeholder expanded by the model's processor from its
    geometry; the engine's tensors are the parts' (the processor makes none)."""
    ids, _ = _tokenize(prompt, features.carriers, files, add_special_tokens, None, features.processor(files))
    found = sum(t == info.image_token_id for t in ids)
    if found != sum(features.rows):
        raise InvalidArgument(f"the rendered prompt has {found} image tokens; its image_embeds parts have "
                              f"{sum(features.rows)} rows {list(features.rows)}")
    return ids, features.tensors


def _image_token_counts(ids: list[int], pictures: list, info: ModelInfo, files: ModelFiles,
                        mm_kwargs: dict[str, Any] | None = None) -> tuple[int, ...]:
    """Image-token positions per image: by contiguous runs when there is one run per image (LLaVA),
    else by asking the processor for each image alone (tiled layouts split one image into many runs)."""
    if not pictures or info.image_token_id is None:
        return ()
    runs: list[int] = []
    prev = False
    for t in ids:
        is_image = t == info.image_token_id
        if is_image and not prev:
            runs.append(0)
        if is_image:
            runs[-1] += 1
        prev = is_image
    if len(runs) == len(pictures):
        return tuple(runs)
    counts = []
    for pic in pictures:
        alone = files.processor(text=files.image_placeholder, images=[pic], return_tensors="pt",
                                **(mm_kwargs or {}))["input_ids"]
        counts.append(int((alone == info.image_token_id).sum()))
    if sum(counts) != sum(runs):
        raise InvalidArgument(f"image tokens in the prompt ({sum(runs)}) do not match the processor's per-image "
                              f"counts {counts}")
    return tuple(counts)


def _finish(ids: list[int], spans: list[Span], rows: list[torch.Tensor],
            model_inputs: dict[str, torch.Tensor], prompt: str, image_counts: tuple[int, ...],
            raw_ids: tuple[int, ...], sampling: SamplingParams, request_id: str, info: ModelInfo) -> Normalized:
    """`ids` hold the filler at span positions; `spans` are in prompt order, span.part indexing `rows`."""
    tensors = [NamedTensor(PROMPT_EMBEDS, r) for r in rows]  # tensor k is part k's rows
    tensors += [NamedTensor(name, t) for name, t in model_inputs.items()]
    request = EngineRequest(
        request_id=request_id,
        token_ids=ids,
        embed_spans=[EmbedSpan(s.offset, s.length, s.part) for s in sorted(spans, key=lambda s: s.offset)],
        tensors=tensors,
        sampling=sampling,
        model_fingerprint=info.fingerprint,
    )
    # The engine's own rules, so that what passes here passes there; the rows' values were checked per part.
    check_request(request, info, "prompt")
    return Normalized(request, prompt, image_counts, raw_ids)
