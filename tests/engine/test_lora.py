"""LoRA adapters in the engine (tiny models, CPU), against HF + PEFT's own generate on the same base and adapter:

- for a text model, an attention VLM whose adapter also adapts its vision tower and connector (tiny-llava) and a
  hybrid (tiny-lfm2-vl, its language model adapted): greedy tokens under the base and under each adapter equal HF +
  PEFT's, with text, with a picture where the family has one, and with the text's embedding rows sent as prompt
  embeddings;
- requests mixing the base and two adapters (and pictures on the VLM) in one batch each get their solo tokens, and a
  step never runs more than --max-loras adapters;
- a prefix cached under one adapter is not hit under another or the base, nor is a tower output under a tower adapter;
- an adapter that cannot be served is refused at load with one line naming it and what is wrong.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.loras import ensure_lora
from engine.lora import load_adapter
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import FailedPrecondition, InvalidArgument, NotFound
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, start_engine, with_embed_span
from tests.engine.family_cases import FamilyCase

N = 8
CASES = {"tiny-text": FamilyCase("tiny-text", images=False), "tiny-llava": FamilyCase("tiny-llava"),
         "tiny-lfm2-vl": FamilyCase("tiny-lfm2-vl")}
PARAMS = [pytest.param(c, id=c.tiny) for c in CASES.values()]


@pytest.fixture(scope="module")
def lora_engines(tiny_dirs):
    """lora_engines(name, **limits): an engine serving `name` with its adapters NAME-lora and NAME-lora2."""
    started = {}

    def get(name: str, **limits):
        key = (name, tuple(sorted(limits.items())))
        if key not in started:
            modules = tuple((f"{name}-lora{s}", str(ensure_lora(f"{name}-lora{s}"))) for s in ("", "2"))
            started[key] = start_engine(tiny_dirs[name], enable_lora=True, lora_modules=modules,
                                        **{"max_loras": 2, "max_cpu_loras": 2, **limits})
        return started[key]

    yield get
    for engine in started.values():
        engine.stop()


def _request(ids, tensors=None, lora="", request_id="r", **sampling) -> EngineRequest:
    return EngineRequest(request_id, list(ids), tensors=[NamedTensor(k, v) for k, v in (tensors or {}).items()],
                         sampling=SamplingParams(**{"temperature": 0.0, "max_tokens": N, **sampling}), lora=lora)


def _hf(engine, tiny_dirs, case: FamilyCase, lora: str):
    """A fresh HF model of the case, with the adapter through PEFT (None: the base)."""
    import transformers
    from peft import PeftModel

    folder = tiny_dirs[case.tiny]
    arch = transformers.AutoConfig.from_pretrained(folder).architectures[0]
    model = getattr(transformers, arch).from_pretrained(folder, dtype=torch.float32).eval()
    return PeftModel.from_pretrained(model, str(ensure_lora(lora))).eval() if lora else model


@pytest.mark.parametrize("case", PARAMS)
async def test_greedy_tokens_equal_hf_peft_under_each_adapter(case, lora_engines, tiny_dirs):
    engine = lora_engines(case.tiny)
    text_ids, _ = case.inputs(tiny_dirs[case.tiny], "Tell me a story about a cat.", images=0)
    image = case.inputs(tiny_dirs[case.tiny]) if case.images else None
    with torch.inference_mode():
        rows = engine.m.embed(torch.tensor(text_ids)).clone()  # [P, hidden]
    answers = {}
    for lora in ("", f"{case.tiny}-lora", f"{case.tiny}-lora2"):
        hf = _hf(engine, tiny_dirs, case, lora)
        text, _ = await collect(engine, _request(text_ids, lora=lora))
        assert text == case.hf_generate(hf, text_ids, {}, N), lora
        embeds = with_embed_span([], {}, 0, rows, max_tokens=N, ignore_eos=False, temperature=0.0)
        embeds.lora = lora
        assert (await collect(engine, embeds))[0] == text, lora
        if image is not None:
            got, _ = await collect(engine, _request(*image, lora=lora))
            assert got == case.hf_generate(hf, *image, N), lora
        answers[lora] = text
    assert len({tuple(a) for a in answers.values()}) == 3  # each adapter changes the answer


@pytest.mark.parametrize("case", PARAMS)
async def test_base_and_two_adapters_in_one_batch_give_their_solo_tokens(case, lora_engines, tiny_dirs):
    engine = lora_engines(case.tiny)
    loras = ("", f"{case.tiny}-lora", f"{case.tiny}-lora2")
    reqs = []
    for k in range(9):
        ids, tensors = case.inputs(tiny_dirs[case.tiny], "word " * (2 + 3 * k),
                                   images=1 if case.images and k % 2 == 0 else 0, shift=k)
        reqs.append(_request(ids, tensors, loras[k % 3], f"r{k}", max_tokens=3 + 2 * k, ignore_eos=True))
    solo = [(await collect(engine, r))[0] for r in reqs]
    packed = engine.packed_steps

    async def staggered(k, r):
        await asyncio.sleep(0.01 * k)
        return (await collect(engine, r))[0]

    assert list(await asyncio.gather(*(staggered(k, r) for k, r in enumerate(reqs)))) == solo
    if engine.m.family.packs_mixed_steps:
        assert engine.packed_steps > packed  # adapters' prompts were packed beside other adapters' decode rows


async def test_a_step_runs_at_most_max_loras_adapters(lora_engines, tiny_dirs):
    engine = lora_engines("tiny-text", max_loras=1)
    seen = []
    execute = engine.runner.execute

    def spy(tokens, parts, loras=None):
        seen.append({a for a in [*(loras or ()), *(p.prompt.adapter for p in parts)] if a is not None})
        return execute(tokens, parts, loras)

    engine.runner.execute = spy
    try:
        reqs = [_request([5, 6, 7, 8 + k], lora=("tiny-text-lora", "tiny-text-lora2")[k % 2], request_id=f"r{k}",
                         max_tokens=6, ignore_eos=True) for k in range(6)]
        solo = [(await collect(engine, r))[0] for r in reqs]
        got = await asyncio.gather(*(collect(engine, r) for r in reqs))
        assert [g[0] for g in got] == solo
    finally:
        engine.runner.execute = execute
    assert max(len(s) for s in seen) == 1


def _counts(cache: str) -> tuple[float, float]:
    """(queries, hits) of the engine's prefix or encoder cache, as its metrics count them so far."""
    from prometheus_client import REGISTRY

    return tuple(REGISTRY.get_sample_value(f"splice_engine_{cache}_cache_{n}_total") or 0.0
                 for n in ("queries", "hits"))


async def _hits(engine, cache: str, req: EngineRequest) -> float:
    before = _counts(cache)
    await collect(engine, req)
    return _counts(cache)[1] - before[1]


async def test_a_prefix_cached_under_one_adapter_is_not_hit_under_another(lora_engines, tiny_dirs):
    engine = lora_engines("tiny-text")
    ids = list(range(10, 10 + 3 * engine.cfg.block_size))
    for lora in ("", "tiny-text-lora", "tiny-text-lora2"):
        await engine.reset_prefix_cache()
        cold = (await collect(engine, _request(ids, lora=lora, ignore_eos=True)))[0]
        for other in {"", "tiny-text-lora", "tiny-text-lora2"} - {lora}:  # cached under `lora` only: no hit
            assert await _hits(engine, "prefix", _request(ids, lora=other, ignore_eos=True)) == 0, (lora, other)
            await engine.reset_prefix_cache()
            await collect(engine, _request(ids, lora=lora, ignore_eos=True))
        # under its own adapter it hits, and gives the uncached tokens
        before = _counts("prefix")
        assert (await collect(engine, _request(ids, lora=lora, ignore_eos=True)))[0] == cold
        assert _counts("prefix")[1] - before[1] > 0, lora


async def test_a_tower_adapter_keys_the_encoder_cache(lora_engines, tiny_dirs):
    engine = lora_engines("tiny-llava")
    case = CASES["tiny-llava"]
    ids, tensors = case.inputs(tiny_dirs["tiny-llava"], shift=7)
    assert engine.loras.get("tiny-llava-lora").vision
    await collect(engine, _request(ids, tensors))
    assert await _hits(engine, "encoder", _request(ids, tensors, lora="tiny-llava-lora")) == 0
    assert await _hits(engine, "encoder", _request(ids, tensors, lora="tiny-llava-lora")) > 0
    assert await _hits(engine, "encoder", _request(ids, tensors)) > 0  # the base's entry is still its own


async def test_unknown_adapter_names_and_lora_off(lora_engines, engines, tiny_dirs):
    with pytest.raises(NotFound, match="nosuch"):
        await collect(lora_engines("tiny-text"), _request([5, 6], lora="nosuch"))
    with pytest.raises(FailedPrecondition, match="--enable-lora"):
        await collect(engines("tiny-text"), _request([5, 6], lora="tiny-text-lora"))


async def test_load_and_unload_at_run_time(lora_engines, tiny_dirs, tmp_path):
    engine = lora_engines("tiny-text")
    ids = [5, 6, 7, 8]
    want = (await collect(engine, _request(ids, lora="tiny-text-lora")))[0]
    await engine.loras.load("mine", str(ensure_lora("tiny-text-lora")))
    assert engine.loras.served["mine"] == str(ensure_lora("tiny-text-lora"))
    assert (await collect(engine, _request(ids, lora="mine")))[0] == want
    with pytest.raises(InvalidArgument, match="already been loaded"):
        await engine.loras.load("mine", str(ensure_lora("tiny-text-lora")))
    engine.loras.unload("mine")
    with pytest.raises(NotFound):
        await collect(engine, _request(ids, lora="mine"))
    with pytest.raises(NotFound, match="cannot be found"):
        engine.loras.unload("mine")


def _copy(name: str, dest) -> str:
    shutil.copytree(ensure_lora(name), dest)
    return str(dest)


def _edit(folder: str, tensors=None, config=None) -> str:
    from pathlib import Path

    if tensors is not None:
        save_file(tensors, str(Path(folder) / "adapter_model.safetensors"))
    if config is not None:
        path = Path(folder) / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


def _refusals(tmp_path):
    """(adapter folder, what the one line must say) for each way an adapter cannot be served."""
    good = ensure_lora("tiny-text-lora")
    weights = load_file(str(good / "adapter_model.safetensors"))
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    wide = {**weights, f"{q}.lora_A.weight": torch.randn(8, 128), f"{q}.lora_B.weight": torch.randn(64, 8)}
    ranked = {**weights, f"{q}.lora_A.weight": torch.randn(32, 64), f"{q}.lora_B.weight": torch.randn(64, 32)}
    unknown = {**weights, "base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight": torch.randn(8, 64),
               "base_model.model.model.layers.0.self_attn.x_proj.lora_B.weight": torch.randn(64, 8)}
    head = {**weights, "base_model.model.lm_head.lora_A.weight": torch.randn(8, 64),
            "base_model.model.lm_head.lora_B.weight": torch.randn(661, 8)}
    corrupt = _copy("tiny-text-lora", tmp_path / "corrupt")
    (tmp_path / "corrupt" / "adapter_model.safetensors").write_bytes(b"\x10\x00garbage")
    no_weights = _copy("tiny-text-lora", tmp_path / "no_weights")
    (tmp_path / "no_weights" / "adapter_model.safetensors").unlink()
    bad_json = _copy("tiny-text-lora", tmp_path / "bad_json")
    (tmp_path / "bad_json" / "adapter_config.json").write_text("{not json")
    return [
        (_edit(_copy("tiny-text-lora", tmp_path / "wide"), wide), "hidden size is 64"),
        (_edit(_copy("tiny-text-lora", tmp_path / "ranked"), ranked), "rank 32, over --max-lora-rank 16"),
        (_edit(_copy("tiny-text-lora", tmp_path / "unknown"), unknown), "x_proj"),
        (_edit(_copy("tiny-text-lora", tmp_path / "head"), head), "lm_head"),
        (corrupt, "not a readable safetensors file"),
        (no_weights, "no adapter_model.safetensors"),
        (bad_json, "adapter_config.json"),
        (_edit(_copy("tiny-text-lora", tmp_path / "dora"), config={"use_dora": True}), "DoRA"),
        (_edit(_copy("tiny-text-lora", tmp_path / "nomatch"), config={"target_modules": ["nothing_here"]}),
         "match no linear layer"),
        (str(tmp_path / "absent"), "is not a folder"),
    ]


async def test_an_adapter_that_cannot_be_served_is_refused_in_one_line_naming_it(lora_engines, tiny_dirs, tmp_path):
    engine = lora_engines("tiny-text")
    for folder, why in _refusals(tmp_path):
        with pytest.raises(InvalidArgument) as err:
            await engine.loras.load("bad-one", folder)
        message = str(err.value)
        assert "'bad-one'" in message and why in message and "\n" not in message, (folder, message)
    assert "bad-one" not in engine.loras.served
    with pytest.raises(InvalidArgument, match=r"'bad-one'.*rank 32"):  # at start too: the engine does not start
        start_engine(tiny_dirs["tiny-text"], enable_lora=True,
                     lora_modules=(("bad-one", _refusals(tmp_path / "again")[1][0]),))


def test_rslora_and_alpha_pattern_scales_follow_peft(tiny_dirs, lora_engines, tmp_path):
    engine = lora_engines("tiny-text")
    folder = _edit(_copy("tiny-text-lora", tmp_path / "rs"),
                   config={"use_rslora": True, "lora_alpha": 12, "alpha_pattern": {"v_proj": 3}})
    adapter = load_adapter("rs", folder, engine.m.lora_targets, 16, 64, torch.device("cpu"), torch.float32)
    assert adapter.weights["model.layers.0.self_attn.q_proj"].scale == pytest.approx(12 / 8 ** 0.5)
    assert adapter.weights["model.layers.1.self_attn.v_proj"].scale == pytest.approx(3 / 8 ** 0.5)


async def test_n_logprobs_grammars_and_cancellation_under_an_adapter(lora_engines, tiny_dirs):
    from transformers import AutoTokenizer

    from splice.structured_output import StructuredOutput

    engine = lora_engines("tiny-text")
    ids = [5, 17, 42, 99, 3, 8]
    solo, outs = await collect(engine, _request(ids, lora="tiny-text-lora", logprobs=True, ignore_eos=True))
    _, forked = await collect(engine, _request(ids, lora="tiny-text-lora", n=2, ignore_eos=True))
    for index in (0, 1):  # each choice of a greedy n = 2 request is the solo answer under the adapter
        assert [t for o in forked if o.index == index for t in o.token_ids] == solo
    hf = _hf(engine, tiny_dirs, CASES["tiny-text"], "tiny-text-lora")
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor([ids + solo[:-1]])).logits[0, len(ids) - 1:].float().log_softmax(-1)
    want = logits.gather(1, torch.tensor(solo)[:, None])[:, 0].tolist()
    assert [lp for o in outs for lp in o.logprobs] == pytest.approx(want, abs=1e-4)
    tok = AutoTokenizer.from_pretrained(tiny_dirs["tiny-text"])
    choice = StructuredOutput("choice", '["north", "south"]')
    got, _ = await collect(engine, _request(ids, lora="tiny-text-lora2", structured=choice, max_tokens=8))
    assert tok.decode(got, skip_special_tokens=True) in ("north", "south")
    stream = engine.generate(_request(ids, lora="tiny-text-lora2", max_tokens=200, ignore_eos=True))
    await anext(stream)
    await stream.aclose()  # the caller leaves: its sequence aborts, the adapter's next request is served
    assert (await collect(engine, _request(ids, lora="tiny-text-lora", ignore_eos=True)))[0] == solo[:N]


def test_lora_with_tensor_parallelism_or_a_simulated_forward_is_refused_in_one_line():
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="--enable-lora is not supported with --tensor-parallel-size"):
        EngineConfig(model="m", enable_lora=True, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="--simulate-forward-ms"):
        EngineConfig(model="m", enable_lora=True, simulate_forward_ms=1.0)
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        EngineConfig(model="m", lora_modules=(("a", "b"),))
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(model="m", enable_lora=True, max_loras=4, max_cpu_loras=2)


def test_lora_modules_take_vllms_two_forms():
    from splice.lora_modules import parse_lora_module

    assert parse_lora_module("sql=/models/sql") == ("sql", "/models/sql")
    assert parse_lora_module('{"name": "a", "path": "/p", "base_model_name": "m"}') == ("a", "/p")
    for bad in ("noequals", "=/p", '{"name": "a"}', '{"name": "a", "path": "/p", "x": 1}', "{bad json"):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_module(bad)
