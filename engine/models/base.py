"""The contract every model family fulfils, with the defaults of a plain decoder-only model.

A family knows one HF architecture: how to load it, what image tensors it accepts and how many feature
rows they make (checked before any forward), the image features in placeholder order, the merge of text
rows, image features and supplied rows, the position ids of a prompt and of a decode step, the attention
masks per layer type, any extra forward inputs, and how its cache's rows join and leave
(engine/models/slot_cache.py for key/value layers, hybrid_cache.py for recurrent states beside them).
The runner (engine/model_runner.py, its forwards in engine/forwards.py) only batches: it pads, stacks and asks the
family.

Shapes: P = prompt length, rows = sequences in the batch, q = new positions this forward, T = key/value
columns the forward attends (rows' real columns differ: the [rows, T] mask says which are real), D =
position_dims (1, or 3 for M-RoPE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine.encoder_cache import EncoderCache, content_key, salted
from engine.models.attention import use_grouped_sdpa
from engine.models.lean_llama import LeanDecoder, unsupported
from engine.models.linear import Linear
from engine.models.slot_cache import SlotKVCache
from splice.engine_request import IMAGE_EMBEDS, EngineRequest
from splice.errors import FailedPrecondition, InvalidArgument
from splice.request_rules import check_finite, check_float_dtype


@dataclass
class Prompt:
    """One sequence's prompt, merged and ready to prefill."""

    embeds: torch.Tensor  # [P, hidden] in the model dtype: text rows, image features and supplied rows
    token_ids: torch.Tensor  # [P] long; filler at span positions, the image token at image positions
    image_mask: torch.Tensor  # [P] bool; positions holding image features
    span_mask: torch.Tensor  # [P] bool; positions holding supplied prompt_embeds rows
    positions: torch.Tensor  # [D, P] long position ids
    # SamplingParams.prompt_logprobs: k alternatives per position are scored at this prompt's prefill (None: not;
    # engine/prompt_logprobs.py)
    prompt_logprobs: int | None = None

    @property
    def next_position(self) -> int:
        """Position id of the first generated token (decode positions continue from max + 1)."""
        return int(self.positions.max()) + 1


@dataclass
class StepInputs:
    """What one forward feeds the backbone, already padded and stacked by the runner."""

    token_ids: torch.Tensor  # [rows, q] long (0 at padding)
    mask: torch.Tensor  # [rows, T] long; 1 = real position, 0 = padding
    image_mask: torch.Tensor | None  # [rows, q] bool at prefill; None at decode (generated tokens are text)
    span_mask: torch.Tensor | None  # [rows, q] bool at prefill; None at decode


def check_float(name: str, t: torch.Tensor) -> None:
    check_float_dtype(t.dtype, name)
    check_finite(t, name)


def check_names(inputs: dict[str, torch.Tensor], accepted: tuple[str, ...], required: tuple[str, ...]) -> None:
    for name in inputs:
        if name not in accepted:
            raise InvalidArgument(f"tensor {name!r} is not an input of this model; expected one of {list(accepted)}")
    for name in required:
        if name not in inputs:
            raise InvalidArgument(f"image inputs without {name!r}; got {sorted(inputs)}")


def feature_rows(out: Any) -> torch.Tensor:
    """get_image_features' answer -> [rows, hidden]. transformers 5 wraps the projected features in a
    BaseModelOutputWithPooling's pooler_output, as one tensor or one tensor per image."""
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    if isinstance(feats, list | tuple):
        feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])
    return feats.reshape(-1, feats.shape[-1])


def first_dim_pieces(inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """One piece per index of the tensors' first dimension (pictures stacked along it, e.g. [images, ...])."""
    return [{name: t[i:i + 1] for name, t in inputs.items()} for i in range(len(inputs["pixel_values"]))]


def grid_pieces(inputs: dict[str, torch.Tensor], grid_name: str) -> list[dict[str, torch.Tensor]]:
    """Pictures whose patch rows are concatenated in pixel_values [patches, ...], each owning the product of its
    grid row's sizes (Qwen2-VL's image_grid_thw, Nemotron's image_grid_hw): one piece per picture."""
    grid = inputs[grid_name]
    counts = grid.long().prod(-1).tolist()
    return [{"pixel_values": pv, grid_name: grid[i:i + 1]}
            for i, pv in enumerate(torch.split(inputs["pixel_values"], counts))]


class ImageGeometry:
    """What a family's image tensors must look like, from its config alone (testable without weights).

    Precomputed features (IMAGE_EMBEDS) skip the vision tower: they travel with the tensors in `beside_embeds`,
    those of the family's image inputs that its positions or masks read besides the image-token positions."""

    beside_embeds: ClassVar[tuple[str, ...]] = ()

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        """Feature rows `inputs` make; InvalidArgument naming the tensor when they are malformed."""
        raise NotImplementedError

    def embeds_rows(self, inputs: dict[str, torch.Tensor]) -> int | None:
        """Feature rows the `beside_embeds` tensors describe (InvalidArgument when malformed); None where they
        describe none."""
        return None


@dataclass(frozen=True)
class SquareImages(ImageGeometry):
    """[images, channels, side, side] pixels -> the same number of feature rows for every image (LLaVA's patches,
    Gemma 3's pooled soft tokens; Gemma 3's pan-and-scan crops are images too)."""

    channels: int
    image_size: int
    rows_per_image: int

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values",), ("pixel_values",))
        pv = inputs["pixel_values"]  # [images, channels, height, width]
        want = (self.channels, self.image_size, self.image_size)
        if pv.dim() != 4 or tuple(pv.shape[1:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [images, {', '.join(map(str, want))}]")
        check_float("pixel_values", pv)
        return pv.shape[0] * self.rows_per_image


class ModelFamily:
    """Defaults: a decoder-only LM (Llama-style) with 1-D positions, one causal mask and a slot KV cache."""

    name: ClassVar[str] = "causal-lm"
    position_dims: ClassVar[int] = 1
    # Whether a mixed step (decode rows + prompt positions) may run as one packed forward (engine/forwards.py
    # `packed`): true where every attention layer takes the one causal mask of `attention_mask` below, the forward
    # needs no extra inputs and the cache holds keys and values only. A family overriding any of those says False.
    packs_mixed_steps: ClassVar[bool] = True
    # image positions attend each other both ways at prefill: a prefix-cache hit must not end inside a run of them
    images_both_ways: ClassVar[bool] = False

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.config = model.config
        self.device = device
        self.dtype = dtype
        # backbone: the text stack (inputs_embeds -> hidden states); lm_head: hidden -> vocabulary logits;
        # embed: the input embedding table (its rows are ModelInfo.vocab_rows)
        self.backbone, self.lm_head, self.embed = self.text_parts(model)
        if self.backbone is None or self.lm_head is None or self.embed is None:
            raise FailedPrecondition(f"{type(model).__name__}: no decoder / input or output embeddings to serve")
        self.cache = SlotKVCache()
        self.impl = "transformers"  # what runs the text stack: "splice" (engine/models/lean_llama.py) or HF's modules
        # hidden -> logits: lm_head itself, or its weight packed for the device's GEMM (engine/models/linear.py)
        self.head: Callable[[torch.Tensor], torch.Tensor] = self.lm_head
        # Image geometry (expected_rows(inputs) -> feature rows, validated before any forward); None = text only
        self.images: ImageGeometry | None = None
        # vision-tower outputs by picture content (engine/encoder_cache.py); None = off. The loader sets it.
        self.encoder_cache: EncoderCache | None = None
        use_grouped_sdpa(model)

    # --- loading -------------------------------------------------------------------------------------

    @classmethod
    def load_model(cls, path: str, config: Any, dtype: torch.dtype, **pretrained: Any) -> torch.nn.Module:
        """The HF model named by config.architectures; sdpa takes the 4-D masks the family builds. `pretrained`:
        more from_pretrained arguments (tp_plan)."""
        import transformers

        arch = (config.architectures or [None])[0]
        model_cls = getattr(transformers, arch, None) if arch else None
        if model_cls is None:
            raise FailedPrecondition(f"{path}: architecture {arch!r} is not a transformers class")
        return model_cls.from_pretrained(path, dtype=dtype, attn_implementation="sdpa", **pretrained)

    @staticmethod
    def text_parts(model: torch.nn.Module) -> tuple[Any, Any, Any]:
        """(text stack, output embeddings, input embeddings) of `model`; None where it has none."""
        return model.get_decoder(), model.get_output_embeddings(), model.get_input_embeddings()

    def select_impl(self, impl: str, tensor_parallel: bool = False) -> str:
        """Runs the text stack with Splice's own forward (engine/models/lean_llama.py) for impl "auto" where it has
        one, "splice" (FailedPrecondition where it has none), or HF's modules ("transformers") -> the one chosen. Called
        once, by the loader (the lean forward takes over HF's q/k/v and gate/up weights as views of fused ones)."""
        if impl == "transformers" or self.impl == "splice":
            return self.impl
        if not tensor_parallel and type(self.lm_head) is torch.nn.Linear:  # (sharded heads gather in module hooks)
            self.head = Linear(self.lm_head.weight, self.lm_head.bias)
        why = self.lean_unsupported() or unsupported(self.backbone, tensor_parallel)
        if why is None:
            self.backbone = LeanDecoder(self.backbone)
            self.impl = "splice"
        elif impl == "splice":
            raise FailedPrecondition(f"--model-impl splice: {why}; use --model-impl auto or transformers")
        return self.impl

    def lean_unsupported(self) -> str | None:
        """Why this family's forward cannot be the lean one: it must hand the backbone one causal mask (or none),
        1-D positions and no extra inputs (what LeanDecoder takes)."""
        cls = type(self)
        if (self.position_dims != 1 or cls.attention_mask is not ModelFamily.attention_mask
                or cls.forward_kwargs is not ModelFamily.forward_kwargs):
            return (f"the {self.name} family passes its text stack inputs the lean forward does not take "
                    "(per-layer-type masks, M-RoPE positions or extra inputs)")
        return None

    @property
    def text_config(self) -> Any:
        return self.config.get_text_config()

    @property
    def image_token_id(self) -> int | None:
        if not self.accepts_images:
            return None
        found = getattr(self.config, "image_token_id", None)
        return found if found is not None else getattr(self.config, "image_token_index", None)

    @property
    def accepts_images(self) -> bool:
        return self.images is not None

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Token IDs [...] -> their input rows [..., hidden] in the model dtype (prompt and decode steps alike)."""
        return self.embed(ids).to(self.dtype)

    # --- images --------------------------------------------------------------------------------------

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[rows, hidden] in placeholder order."""
        raise FailedPrecondition(f"{self.name} models take no image inputs")

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """The request's image inputs cut into the pieces the vision tower encodes independently (a picture, or a
        tile), in placeholder order, each a valid input of image_features on its own whose rows are that piece's.
        The encoder cache keys each piece by its content. Default: the whole request is one piece (a hit needs the
        same pictures in the same order)."""
        return [inputs]

    def join_pieces(self, pieces: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Pieces of one request's image_pieces as one image_features input whose rows are the
        pieces' rows in order. Default: each tensor concatenated along its first dimension."""
        if len(pieces) == 1:
            return pieces[0]
        return {name: torch.cat([p[name] for p in pieces]) for name in pieces[0]}

    def image_keys(self, req: EngineRequest) -> list[str] | None:
        """The encoder cache's keys of `req`'s image pieces, in order; None where it has no cache or none to key
        (no pictures, precomputed features, or no piece the tower would encode alone)."""
        inputs = req.model_inputs
        if self.encoder_cache is None or not inputs or IMAGE_EMBEDS in inputs:
            return None
        return [salted(content_key(p), req.sampling.cache_salt) for p in self.image_pieces(inputs)] or None

    def cached_image_features(self, inputs: dict[str, torch.Tensor], keys: list[str] | None = None,
                              salt: str | None = None) -> torch.Tensor:
        """image_features through the encoder cache (`keys`: image_keys, already made; else made here with the
        request's cache `salt`): the pieces found are not encoded again, the others (each distinct one once) are
        encoded together in one call; rows in placeholder order."""
        cache = self.encoder_cache
        pieces = self.image_pieces(inputs) if cache is not None else []
        if not pieces:  # off, or nothing the tower would encode on its own: leave it to the tower's own rules
            return self.image_features(inputs)
        if keys is None or len(keys) != len(pieces):
            keys = [salted(content_key(p), salt) for p in pieces]
        found = {k: rows for k in dict.fromkeys(keys) if (rows := cache.get(k)) is not None}
        missed = [k for k in dict.fromkeys(keys) if k not in found]
        cache.count(len(keys), len(keys) - len(missed))  # a piece repeated within the request is a hit too
        if missed:
            first = {k: pieces[keys.index(k)] for k in missed}
            sizes = [self.images.expected_rows(first[k]) for k in missed]
            new = self.image_features(self.join_pieces(list(first.values())))
            for k, rows in zip(missed, torch.split(new, sizes), strict=True):
                found[k] = rows = rows.clone() if len(missed) > 1 else rows  # a view would hold all of `new`
                cache.put(k, rows)
        return torch.cat([found[k] for k in keys])

    # --- the prompt ----------------------------------------------------------------------------------

    def prompt(self, req: EngineRequest) -> Prompt:
        """Lookup of every ID, image features at image-token positions (in order), supplied rows at spans."""
        ids = torch.tensor(req.token_ids, dtype=torch.long, device=self.device)  # [P]
        embeds = self.lookup(ids)  # [P, hidden]
        span_mask = torch.zeros(len(ids), dtype=torch.bool, device=self.device)
        for span in req.embed_spans:
            span_mask[span.offset:span.offset + span.length] = True
        image_mask = torch.zeros_like(span_mask)
        inputs = req.model_inputs
        if inputs:
            image_mask = (ids == self.image_token_id) & ~span_mask
            # supplied features (validated against the image tokens) skip the vision tower
            features = (inputs[IMAGE_EMBEDS] if IMAGE_EMBEDS in inputs
                        else self.cached_image_features(inputs, req.image_keys, req.sampling.cache_salt))
            embeds[image_mask] = features.to(device=self.device, dtype=self.dtype)
        for span in req.embed_spans:
            embeds[span.offset:span.offset + span.length] = req.span_rows(span).to(device=self.device,
                                                                                   dtype=self.dtype)
        positions = self.prompt_positions(ids, image_mask, inputs)
        return Prompt(embeds, ids, image_mask, span_mask, positions, req.sampling.prompt_logprobs)

    def prompt_positions(self, ids: torch.Tensor, image_mask: torch.Tensor,
                         inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[D, P] position ids of a prompt: 0..P-1 by default."""
        return torch.arange(len(ids), device=self.device)[None]

    # --- one forward ---------------------------------------------------------------------------------

    def causal_mask(self, mask: torch.Tensor, q: int, window: int | None = None,
                    dense: bool = False) -> torch.Tensor | None:
        """mask [rows, T] (T includes the q new columns) -> boolean [rows, 1, q, T] (True = attend), or None when
        SDPA needs none: nothing padded and the queries are one decode position or the whole (causal) prompt.
        `window` limits how far back a query sees (sliding-window layers); `dense` always builds the tensor."""
        width = mask.shape[1]
        if not dense and (q == 1 or q == width) and (window is None or width <= window) and bool(mask.all()):
            return None
        key = torch.arange(width, device=mask.device)
        # Rows may end at different columns (each row's keys sit in its own slot): a row's q queries are its last
        # q real columns, and the window counts back from each of them.
        last = (mask * key).max(1).values  # [rows]
        query = last[:, None] - q + 1 + torch.arange(q, device=mask.device)  # [rows, q]
        allowed = key[None, None, :] <= query[:, :, None]  # [rows, q, T]
        if window is not None:
            allowed &= key[None, None, :] > query[:, :, None] - window
        return (allowed & mask[:, None, :].bool())[:, None]  # [rows, 1, q, T]

    def attention_mask(self, step: StepInputs) -> torch.Tensor | dict[str, torch.Tensor | None] | None:
        """What the backbone takes as attention_mask: one 4-D mask (or None), or one per layer type."""
        return self.causal_mask(step.mask, step.token_ids.shape[1])

    def chunkable(self, prompt: Prompt) -> bool:
        """Whether `prompt` may be prefilled in chunks (each chunk attending to the cached columns before it) with
        the same result as in one forward: where attention is causal and no layer carries a recurrent state (whose
        prefill kernels take a whole prompt), as the cache kind says."""
        return self.cache.chunkable

    def forward_kwargs(self, step: StepInputs, embeds: torch.Tensor) -> dict[str, Any]:
        """Extra backbone inputs computed from the IDs (e.g. Gemma 4's per-layer inputs)."""
        return {}

    def synchronize(self) -> None:
        """Waits for the forwards launched so far (the engine calls it before it samples). Nothing to do for a real
        model: reading the sampled tokens waits for the device (engine/simulate.py simulates that wait here)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] -> float logits [rows, vocab]."""
        return self.head(hidden).float()
