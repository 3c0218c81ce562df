"""EngineConfig: the engine's deployment knobs, validated once at construction."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.models.lean_llama import IMPLS
from splice.sampling import DEFAULT_STRUCTURED_CACHE_MB, DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    model: str  # a local HF folder (already resolved by app.models.resolve_model)
    device: str = "auto"  # "auto" = cuda when available, else cpu; "cuda:1" style indices allowed
    dtype: str = "auto"  # "auto" = the checkpoint's dtype on cuda, float32 on cpu
    max_model_len: int | None = None  # None = the config's max_position_embeddings
    max_running_seqs: int = 64  # sequences decoded together in one step
    # sequences one request may hold (its n choices, all running together); None = max_running_seqs. A request of
    # more is refused (INVALID_ARGUMENT), so that one request cannot take every running slot from the others
    max_seqs_per_request: int | None = None
    # positions one forward may process (padded prefill rows, or decode rows); None = max(8192, max_model_len),
    # so any prompt the model accepts can be prefilled
    max_batch_tokens: int | None = None
    max_queue: int = 256  # waiting requests beyond which new ones get RESOURCE_EXHAUSTED
    model_name: str | None = None  # what GetModelInfo reports; None = `model`
    # request tensor bytes (embeds, pixels) held at once across all calls being received, queued or running;
    # past it new calls get RESOURCE_EXHAUSTED instead of the process running out of memory
    max_inflight_tensor_bytes: int = 4 << 30
    # seconds a Generate stream may go without sending its next part while uploading; then it fails
    # DEADLINE_EXCEEDED and releases its share of the budget above (idle uploads cannot starve the others)
    upload_idle_timeout: float = 30.0
    # while sequences decode, a step prefills at most this many newly admitted prompt positions (a longer prompt
    # over several steps): smaller keeps inter-token latency flat under arrivals, larger admits faster
    mixed_prefill_tokens: int | None = None  # None: by device (engine/scheduler.py mixed_prefill_default)
    # ranks holding a shard of the model each (transformers' tensor-parallel plan on torch.distributed)
    tensor_parallel_size: int = 1
    # a stream's outputs go out every this many tokens (its first token and its end at once): fewer, larger
    # messages on both hops for more throughput, at the price of burstier streams (SGLang's --stream-interval)
    stream_interval: int = 1
    # a request whose reader is this many tokens behind what was sent to it is paused (its sequences keep their slots
    # but are not decoded) until the reader takes them (engine/flow.py); 0 = never paused. 256: what a reader that
    # stopped costs before it is paused is this many tokens at each hop (2048 let 8 such readers of 16 choices take
    # the hostile soak's normal p99 from 0.5 to 3.2 s; 256: 1.8 s), while the preprocessor's acknowledgements (every
    # 64 tokens) keep a reader that reads well under it
    max_unread_tokens: int = 256
    # a request paused this many seconds is cancelled (DEADLINE_EXCEEDED), so that its slots go to readers that read
    unread_timeout: float = 60.0
    # what runs the text stack (vLLM's --model-impl): "auto" = Splice's own forward where the architecture has one
    # (engine/models/lean_llama.py: Llama, Qwen2), else transformers' modules; "splice" = Splice's or an error;
    # "transformers" = always transformers' modules
    model_impl: str = "auto"
    # torch's intra-op threads in this process (and each tensor-parallel rank); None = leave torch's setting, as
    # an engine embedded in someone else's process should. `splice engine` passes auto_torch_threads()
    torch_threads: int | None = None
    # torch's threads on the CPU for the packed matrix products and for a step that prefills many prompt positions
    # (engine/step_threads.py), where torch_threads is set and this is more; None = torch_threads for everything.
    # `splice engine` passes auto_compute_threads()
    compute_threads: int | None = None
    # MiB of vision-tower outputs kept by picture content (engine/encoder_cache.py), so a re-sent picture is not
    # encoded again; least recently used evicted first; 0 = off
    encoder_cache_mb: int = 512
    # the prefix cache (engine/prefix_cache.py): key/value columns of whole blocks of prompt positions kept by content,
    # so a prompt that begins with a cached prefix prefills only the rest (vLLM's --enable-prefix-caching, on by
    # default); blocks of `block_size` positions within `prefix_cache_mb` MiB, least recently used evicted first
    enable_prefix_caching: bool = True
    block_size: int = 16
    prefix_cache_mb: int = 1024
    # a structured output's grammar that takes longer than this to compile is refused (INVALID_ARGUMENT); the
    # compile runs in its own thread, never the step's
    structured_compile_timeout: float = DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S
    # MiB of compiled grammars kept, least recently used evicted first; one that compiles larger is refused
    structured_cache_mb: int = DEFAULT_STRUCTURED_CACHE_MB
    # a benchmarking aid (engine/simulate.py): the model's forward and vision tower are replaced by a wait of this
    # many milliseconds per forward that holds no CPU, as a GPU kernel would, with deterministic logits; None = off
    simulate_forward_ms: float | None = None
    # LoRA adapters (vLLM's flags; engine/lora/): served per request by name, several in one forward
    enable_lora: bool = False
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, PEFT folder) read at start
    max_loras: int = 1  # distinct adapters the running sequences (so one step's forward) may have
    max_lora_rank: int = 16  # an adapter of a larger rank is refused at load
    max_cpu_loras: int | None = None  # adapters kept in memory (least recently used dropped); None = max_loras

    def __post_init__(self) -> None:
        base = self.device.split(":", 1)[0]
        if base not in DEVICES or (base != "cuda" and ":" in self.device):
            raise ValueError(f"device must be one of {DEVICES} (or cuda:N), got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_running_seqs < 1:
            raise ValueError(f"max_running_seqs must be >= 1, got {self.max_running_seqs}")
        if self.max_seqs_per_request is not None and self.max_seqs_per_request < 1:
            raise ValueError(f"max_seqs_per_request must be >= 1, got {self.max_seqs_per_request}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.max_running_seqs:
            raise ValueError(f"max_batch_tokens ({self.max_batch_tokens}) must be >= max_running_seqs "
                             f"({self.max_running_seqs}): every running sequence decodes one position per step")
        if self.max_inflight_tensor_bytes < 1:
            raise ValueError(f"max_inflight_tensor_bytes must be >= 1, got {self.max_inflight_tensor_bytes}")
        if self.upload_idle_timeout <= 0:
            raise ValueError(f"upload_idle_timeout must be > 0, got {self.upload_idle_timeout}")
        if self.mixed_prefill_tokens is not None and self.mixed_prefill_tokens < 1:
            raise ValueError(f"mixed_prefill_tokens must be >= 1, got {self.mixed_prefill_tokens}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_unread_tokens < 0:
            raise ValueError(f"max_unread_tokens must be >= 0, got {self.max_unread_tokens}")
        if not self.unread_timeout > 0:
            raise ValueError(f"unread_timeout must be > 0, got {self.unread_timeout}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.model_impl not in IMPLS:
            raise ValueError(f"model_impl must be one of {IMPLS}, got {self.model_impl!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        if self.compute_threads is not None and self.compute_threads < 1:
            raise ValueError(f"compute_threads must be >= 1, got {self.compute_threads}")
        if self.encoder_cache_mb < 0:
            raise ValueError(f"encoder_cache_mb must be >= 0, got {self.encoder_cache_mb}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if not self.structured_compile_timeout > 0:
            raise ValueError(f"structured_compile_timeout must be > 0, got {self.structured_compile_timeout}")
        if self.structured_cache_mb < 1:
            raise ValueError(f"structured_cache_mb must be >= 1, got {self.structured_cache_mb}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.simulate_forward_ms is not None:
            if not 0 <= self.simulate_forward_ms < 60_000:
                raise ValueError(f"simulate_forward_ms must be >= 0 and < 60000, got {self.simulate_forward_ms}")
            if self.tensor_parallel_size > 1:
                raise ValueError("simulate_forward_ms needs tensor_parallel_size 1 (a simulated forward has no "
                                 f"shards), got {self.tensor_parallel_size}")

        self._check_lora()

    def _check_lora(self) -> None:
        if self.lora_modules and not self.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        names = [n for n, _ in self.lora_modules]
        if len(set(names)) != len(names):
            twice = sorted(n for n in set(names) if names.count(n) > 1)
            raise ValueError(f"--lora-modules names an adapter twice: {twice}")
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ValueError("--enable-lora is not supported with --tensor-parallel-size > 1 (adapters apply to the "
                             "whole, unsharded linears); serve LoRA at --tensor-parallel-size 1")
        if self.enable_lora and self.simulate_forward_ms is not None:
            raise ValueError("--enable-lora needs the real forward, not --simulate-forward-ms")

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    @property
    def served_name(self) -> str:
        return self.model_name or self.model


CPU_MAX = "/sys/fs/cgroup/cpu.max"  # cgroup v2: "QUOTA PERIOD" or "max PERIOD" (docker --cpus, a k8s CPU limit)


def usable_cpus(cpu_max: str = CPU_MAX) -> int:
    """CPUs this process may run on: its affinity, capped by its cgroup's CPU quota (rounded up) when it has one."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return cpus
    return max(1, min(cpus, -(-int(quota) // int(period))))


def auto_torch_threads(ranks: int = 1, cpu_max: str = CPU_MAX) -> int:
    """torch threads for each of `ranks` engine processes on this host: $OMP_NUM_THREADS when set, else the usable
    CPUs less one, shared by the ranks (at least one each).

    The CPU left over is the event loop's (gRPC, the tokens going out) and a co-located preprocessor's: torch's
    default takes every core, and its OpenMP threads spin between the small ops of a decode step, so on a small
    host they take the core the loop needs (README, Performance: bench.torch_threads)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (usable_cpus(cpu_max) - 1) // ranks)


def auto_compute_threads(ranks: int = 1, cpu_max: str = CPU_MAX) -> int | None:
    """torch threads for the matrix products and for a step that prefills many prompt positions
    (engine/step_threads.py): every usable CPU where $OMP_NUM_THREADS is unset and the engine is one process; None
    (the usual count for everything) otherwise."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if (env.isdigit() and int(env) > 0) or ranks > 1:
        return None
    return usable_cpus(cpu_max)
