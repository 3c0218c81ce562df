"""Where adapters apply: every linear layer of the model but the vocabulary projection, made a Site at load
(engine/lora/apply.py) when --enable-lora is given.

Splice's own text forward (engine/models/lean_llama.py) multiplies fused weights, q/k/v as one and gate/up as one: its
four linears per layer become sites whose output slices take each HF module's delta. Every other nn.Linear (the
language model's under transformers' modules, the vision tower's, the connector's) keeps its module and gets a forward
hook that adds the deltas to its output, so transformers' code runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.lora.adapter import Target
from engine.lora.apply import LoraState, Site
from engine.models.base import ModelFamily
from engine.models.lean_llama import LeanDecoder


class Adapted:
    """A linear of the lean forward, with its site's deltas added to its output."""

    def __init__(self, base: Callable[[torch.Tensor], torch.Tensor], site: Site) -> None:
        self.base = base
        self.site = site

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.site(x, self.base(x))


def _hook(site: Site) -> Callable:
    def add_deltas(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return site(args[0], output)
    return add_deltas


def attach(family: ModelFamily) -> dict[str, Target]:
    """Makes every adaptable linear of `family`'s model a site, sets `family.lora` -> the targets an adapter may name
    (module path -> Target)."""
    model = family.model
    state = LoraState(family.device)
    names = {id(m): n for n, m in model.named_modules()}
    lean = isinstance(family.backbone, LeanDecoder)
    text = names[id(family.backbone.hf if lean else family.backbone)]
    covered: set[int] = set()
    if lean:
        for layer in family.backbone.layers:
            for attr, modules in layer.fused:
                slices, at = [], 0
                for m in modules:
                    slices.append((names[id(m)], at, at + m.out_features))
                    at += m.out_features
                    covered.add(id(m))
                setattr(layer, attr, Adapted(getattr(layer, attr), Site(state, slices)))
    targets = {}
    for name, m in model.named_modules():
        if type(m) is not torch.nn.Linear or m is family.lm_head:
            continue
        targets[name] = Target(m.in_features, m.out_features, vision=not name.startswith(text + "."))
        if id(m) not in covered:
            m.register_forward_hook(_hook(Site(state, [(name, 0, m.out_features)])))
    family.lora = state
    return targets
