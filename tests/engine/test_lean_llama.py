"""Splice's own forward of Llama-architecture text stacks (engine/models/lean_llama.py, `--model-impl`), checked
against transformers itself:

- its logits equal HF's modules on the same runner steps: a left-padded group prefill, decode steps with rows at
  different columns, a packed mixed step (whole prompts and a long prompt in parts), a long prompt chunked; for
  tiny-text (Llama), the Llama text stacks of LLaVA and Idefics3, and LLaVA-OneVision's Qwen2 (q/k/v biases);
- its logits equal HF's own LlamaModel forward on HF's own DynamicCache (prefill, then decode);
- the engine's greedy tokens equal HF generate with --model-impl auto and transformers (text, and text + image);
- HF's q/k/v and gate/up parameters are views into the fused tensors (each weight held once);
- the flag: a bad value is a clear error; "splice" where there is no lean forward is FailedPrecondition.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from engine.config import EngineConfig
from engine.loader import load
from engine.models.lean_llama import unsupported
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import FailedPrecondition
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request
from tests.engine.family_cases import CASES
from tests.engine.runner_rows import Part, Rows

LEAN = ("tiny-text", "tiny-llava", "tiny-idefics3", "tiny-llava-onevision")


def _case(tiny: str):
    return next(c for c in CASES if c.tiny == tiny)


@pytest.fixture(scope="module", params=LEAN)
def pair(request, tiny_dirs):
    """(case, model dir, family on the lean forward, family on transformers' modules): two loads of one checkpoint."""
    folder = str(tiny_dirs[request.param])
    lean = load(EngineConfig(model=folder, model_impl="auto")).family
    hf = load(EngineConfig(model=folder, model_impl="transformers")).family
    return _case(request.param), tiny_dirs[request.param], lean, hf


def _steps(family, case, model_dir, monkeypatch) -> list[torch.Tensor]:
    """Every kind of forward the runner makes, in one sequence -> the logits of each."""
    import engine.forwards as forwards

    monkeypatch.setattr(forwards, "PREFILL_CHUNK", 16)  # so the long prompt's prefill is chunked
    prompts = [family.prompt(EngineRequest(f"t{k}", random_ids(n, seed=k))) for k, n in enumerate((6, 13, 9, 21))]
    if case.images:
        ids, tensors = case.inputs(model_dir)
        long = family.prompt(EngineRequest("img", ids, [], [NamedTensor(k, v) for k, v in tensors.items()]))
    else:
        long = family.prompt(EngineRequest("long", random_ids(40, seed=8)))
    runner = Rows(family)

    def tokens() -> list[int]:  # fixed inputs: the comparison is of logits, not of what they pick
        return [40 + k for k in range(len(runner.seq_ids))]

    out = [runner.prefill([0, 1], prompts[:2])]  # left-padded: the rows start at different columns
    out += runner.mixed(tokens(), [Part(2, prompts[2], 0, 9), Part(3, prompts[3], 0, 21)])
    runner.remove({1})  # the last row moves into the leaving one's slot
    n = len(long.token_ids)
    for start, end in ((0, 5), (5, n)):  # a long prompt in two packed parts
        out += runner.mixed(tokens(), [Part(4, long if start == 0 else None, start, end)])
    out.append(runner.prefill([5], [long]))  # alone, chunk by chunk
    for _ in range(4):  # the rows end at different columns
        out.append(runner.decode(tokens()))
    return out


def test_lean_logits_equal_transformers_modules_on_every_kind_of_step(pair, monkeypatch):
    case, model_dir, lean, hf = pair
    assert (lean.impl, hf.impl) == ("splice", "transformers")
    got, want = _steps(lean, case, model_dir, monkeypatch), _steps(hf, case, model_dir, monkeypatch)
    assert [t.shape for t in got] == [t.shape for t in want]
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, msg=lambda m, k=k: f"forward {k}: {m}")


def test_lean_logits_equal_hf_llama_model_on_its_own_cache(tiny_dirs):
    """No Splice cache or mask on the reference side: HF's LlamaForCausalLM with a DynamicCache."""
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family
    model = family.model
    ids = torch.tensor([random_ids(17, seed=3)])
    with torch.inference_mode():
        cache = DynamicCache()
        want = [model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]]
        runner = Rows(family)
        got = [runner.prefill([0], [family.prompt(EngineRequest("r", ids[0].tolist()))])]
        for _ in range(5):
            token = int(want[-1].argmax(-1))
            want.append(model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[:, -1])
            got.append(runner.decode([token]))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.float())


def test_fused_weights_are_hf_parameters_views(tiny_dirs):
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family
    for layer, hf in zip(family.backbone.layers, family.backbone.hf.layers, strict=True):
        for fused, parts in ((layer.qkv.weight, (hf.self_attn.q_proj, hf.self_attn.k_proj, hf.self_attn.v_proj)),
                             (layer.gate_up.weight, (hf.mlp.gate_proj, hf.mlp.up_proj))):
            assert torch.equal(fused, torch.cat([p.weight for p in parts]))
            base = fused.untyped_storage().data_ptr()
            assert all(p.weight.untyped_storage().data_ptr() == base for p in parts)


@pytest.mark.parametrize("impl", ["auto", "transformers"])
@pytest.mark.parametrize("tiny", ["tiny-text", "tiny-idefics3"])
async def test_greedy_tokens_equal_hf_generate_with_either_impl(tiny, impl, tiny_dirs):
    case = _case(tiny)
    engine = start_engine(tiny_dirs[tiny], model_impl=impl)
    try:
        assert engine.m.family.impl == ("splice" if impl == "auto" else "transformers")
        ids, tensors = case.inputs(tiny_dirs[tiny], "Tell me a story about a cat.", images=1 if case.images else 0)
        req = EngineRequest("r", ids, [], [NamedTensor(k, v) for k, v in tensors.items()],
                            text_request(ids, max_tokens=12).sampling)
        got, _ = await collect(engine, req)
        assert got == case.hf_generate(engine.m.model, ids, tensors, 12)
    finally:
        engine.stop()


def test_splice_impl_where_there_is_none_is_failed_precondition(tiny_dirs):
    with pytest.raises(FailedPrecondition, match="--model-impl splice: the gemma3 family"):
        load(EngineConfig(model=str(tiny_dirs["tiny-gemma3"]), model_impl="splice"))
    assert load(EngineConfig(model=str(tiny_dirs["tiny-gemma3"]))).family.impl == "transformers"  # auto
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_impl="transformers")).family
    with pytest.raises(FailedPrecondition, match="tensor parallelism"):
        family.select_impl("splice", tensor_parallel=True)
    assert family.select_impl("auto", tensor_parallel=True) == "transformers"


def test_cli_rejects_a_bad_model_impl():
    proc = subprocess.run([sys.executable, "-m", "app.cli", "engine", "--model", "tiny-text", "--model-impl", "vllm"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--model-impl: invalid choice: 'vllm'" in proc.stderr


def test_what_keeps_transformers_modules():
    """Checkpoints whose forward the lean one would not reproduce keep HF's modules (auto) with the reason said."""
    from transformers import LlamaConfig, LlamaModel

    small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=32)
    assert unsupported(LlamaModel(LlamaConfig(**small))) is None
    dynamic = LlamaConfig(**small, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert "changes its frequencies" in unsupported(LlamaModel(dynamic))
    wrapped = LlamaModel(LlamaConfig(**small))
    wrapped.layers[0].mlp.up_proj = torch.nn.Sequential(wrapped.layers[0].mlp.up_proj)
    assert "not plain torch Linear" in unsupported(wrapped)
    assert "tensor parallelism" in unsupported(LlamaModel(LlamaConfig(**small)), tensor_parallel=True)
