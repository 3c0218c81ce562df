"""LoRA adapters in PEFT's format, served per request and batched across adapters in one forward: reading and
checking an adapter (adapter.py), the adapters served and those in memory (registry.py), the engine's face on them
(served.py), where they apply (sites.py) and the batched apply (apply.py)."""

from engine.lora.adapter import LoraAdapter, Target, load_adapter
from engine.lora.apply import LoraState
from engine.lora.registry import LoraRegistry
from engine.lora.sites import attach

__all__ = ["LoraAdapter", "LoraRegistry", "LoraState", "Target", "attach", "load_adapter"]
