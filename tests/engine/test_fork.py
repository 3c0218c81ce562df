"""n > 1 choices from one prompt (engine/fork.py), per model family on the tiny models: the prompt is prefilled once,
its row (key/value columns and any recurrent state) copied into the other choices, which then run on their own.

- seeded: choice i of an n = 3 request equals a request of n = 1 with seed + i (vLLM's rule), while another request
  runs in the batch (the copies join a batch of rows of other lengths), with penalties on (each choice's counts are
  its own), an image in the prompt for every vision family, and hybrid caches (Qwen3.5, LFM2-VL, Nemotron-H);
- greedy: every choice equals the greedy answer alone;
- the prompt's prefill is recorded once; a cancelled request frees every choice; n beyond the running slots is
  refused before any work; a long prompt prefilled over several steps forks too.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from engine.metrics import EngineStats
from engine.models.slot_cache import SlotKV
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, random_ids, start_engine
from tests.engine.family_cases import CASES, FamilyCase

N = 6  # tokens per choice
SEED = 1234
SAMPLED = dict(temperature=1.0, seed=SEED, ignore_eos=True, max_tokens=N, frequency_penalty=0.4,
               repetition_penalty=1.3, logprobs=True)
# A choice's logprobs equal its solo request's within what batching changes in float32 (a few 1e-6): a copied state
# that were off shows there first (a tiny model's random weights leave the tokens unchanged by small differences).
LOGPROB_ATOL = 1e-4



def _request(ids, tensors, request_id="r", **sampling) -> EngineRequest:
    return EngineRequest(request_id, list(ids), tensors=[NamedTensor(k, v) for k, v in tensors.items()],
                         sampling=SamplingParams(**sampling))


async def _choices(engine, req: EngineRequest, logprobs: dict | None = None) -> tuple[dict[int, list[int]], list]:
    """Each choice's tokens by index (and into `logprobs`, its logprobs), and the final outputs (one per choice)."""
    tokens: dict[int, list[int]] = {}
    finals = []
    async for out in engine.generate(req):
        tokens.setdefault(out.index, []).extend(out.token_ids)
        if logprobs is not None:
            logprobs.setdefault(out.index, []).extend(out.logprobs)
        if out.finished:
            finals.append(out)
    return tokens, finals


async def _solo(engine, req: EngineRequest) -> tuple[list[int], list[float]]:
    _, outs = await collect(engine, req)
    return [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs]


@contextlib.asynccontextmanager
async def _neighbour(engine, ids):
    """Another request running in the batch (it has started) for as long as the block lasts."""
    outputs = engine.generate(_request(ids, {}, "neighbour", temperature=0.0, ignore_eos=True, max_tokens=400))
    await anext(outputs)
    task = asyncio.ensure_future(_drain(outputs))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await outputs.aclose()


async def _drain(outputs) -> None:
    async for _ in outputs:
        pass


@pytest.mark.parametrize("case", [pytest.param(c, id=c.tiny) for c in CASES])
async def test_each_choice_equals_its_solo_request_seeded_and_greedy(case: FamilyCase, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, tensors = case.inputs(tiny_dirs[case.tiny], "Describe it in detail.", images=1 if case.images else 0)
    logprobs: dict[int, list[float]] = {}
    async with _neighbour(engine, random_ids(11, seed=3)):
        got, finals = await _choices(engine, _request(ids, tensors, n=3, **SAMPLED), logprobs)
    solo = [await _solo(engine, _request(ids, tensors, **{**SAMPLED, "seed": SEED + i})) for i in range(3)]
    assert [got[i] for i in range(3)] == [t for t, _ in solo] and len({tuple(t) for t, _ in solo}) > 1  # they differ
    for i, (_, lps) in enumerate(solo):
        assert logprobs[i] == pytest.approx(lps, abs=LOGPROB_ATOL), f"choice {i}"
    assert sorted(f.index for f in finals) == [0, 1, 2]
    assert {(f.usage.prompt_tokens, f.usage.completion_tokens) for f in finals} == {(len(ids), N)}

    greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=N)
    alone, _ = await collect(engine, _request(ids, tensors, **greedy))
    got, _ = await _choices(engine, _request(ids, tensors, n=2, **greedy))
    assert got == {0: alone, 1: alone}
    assert engine.num_running == 0 and engine.scheduler.reserved == 0


class _Recorded(EngineStats):
    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generated_tokens = 0

    def prefilled(self, batch: int, prompt_tokens: int, seconds: float, ttfts: list[float]) -> None:
        self.prompt_tokens += prompt_tokens

    def generated(self, tokens: int) -> None:
        self.generated_tokens += tokens


async def test_the_prompt_is_prefilled_once_for_all_choices(engines):
    engine = engines("tiny-text")
    engine.stats = recorded = _Recorded()
    try:
        got, _ = await _choices(engine, _request(random_ids(23, seed=5), {}, n=4, **SAMPLED))
        for _ in range(1000):  # the engine thread counts a step's tokens just after it sends them
            if recorded.generated_tokens == 4 * N:
                break
            await asyncio.sleep(0.01)
    finally:
        engine.stats = EngineStats()
    assert recorded.prompt_tokens == 23  # once, not 4 x 23
    assert recorded.generated_tokens == 4 * N and sorted(got) == [0, 1, 2, 3]


async def test_first_token_choices_and_stops_end_each_choice_on_its_own(engines):
    engine = engines("tiny-text")
    ids = random_ids(9, seed=8)
    got, finals = await _choices(engine, _request(ids, {}, n=5, temperature=1.0, seed=9, max_tokens=1))
    assert {i: len(t) for i, t in got.items()} == dict.fromkeys(range(5), 1)
    assert all(f.finish_reason == "length" for f in finals)
    # a stop token: each choice ends where its own tokens hit it
    plain, _ = await _choices(engine, _request(ids, {}, n=3, **SAMPLED))
    stop = plain[1][2]
    got, finals = await _choices(engine, _request(ids, {}, n=3, **SAMPLED, stop_token_ids=(stop,)))
    for i in range(3):
        want = plain[i][:plain[i].index(stop) + 1] if stop in plain[i] else plain[i]
        assert got[i] == want
    assert {f.index: f.finish_reason for f in finals}[1] == "stop"


@pytest.mark.parametrize("tiny", ["tiny-text", "tiny-gemma3"])  # its parts packed with the decode, or not
async def test_a_long_prompt_prefilled_over_several_steps_forks_too(tiny_dirs, tiny):
    engine = start_engine(tiny_dirs[tiny], mixed_prefill_tokens=8)
    try:
        ids = random_ids(30, seed=21)
        logprobs: dict[int, list[float]] = {}
        async with _neighbour(engine, random_ids(5, seed=4)):
            got, _ = await _choices(engine, _request(ids, {}, n=3, **SAMPLED), logprobs)
        solo = [await _solo(engine, _request(ids, {}, **{**SAMPLED, "seed": SEED + i})) for i in range(3)]
        assert [got[i] for i in range(3)] == [t for t, _ in solo]
        assert [logprobs[i] for i in range(3)] == [pytest.approx(lps, abs=LOGPROB_ATOL) for _, lps in solo]
    finally:
        engine.stop()


async def test_a_cancelled_request_frees_every_choice(engines):
    engine = engines("tiny-text")
    outputs = engine.generate(_request(random_ids(7, seed=2), {}, n=3, temperature=1.0, ignore_eos=True,
                                       max_tokens=400))
    seen = set()
    while seen != {0, 1, 2}:  # every choice is running
        seen.add((await anext(outputs)).index)
    assert engine.num_running == 3
    await outputs.aclose()
    for _ in range(1000):  # the engine drains the aborts at its next step
        if engine.num_running == 0 and not engine.requests and engine.runner.batch is None:
            break
        await asyncio.sleep(0.01)
    assert engine.num_running == 0 and not engine.requests and engine.runner.batch is None
    assert engine.scheduler.reserved == 0


async def test_n_beyond_the_running_slots_is_refused_before_any_work(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-text"], max_running_seqs=4)
    try:
        rows = engine.info.vocab_rows
        with pytest.raises(InvalidArgument, match=r"n is 5.*--max-running-seqs"):  # before the IDs are checked
            await collect(engine, _request([1, rows + 7], {}, n=5, temperature=0.0, max_tokens=2))
        got, _ = await _choices(engine, _request([1, 2, 3], {}, n=4, temperature=0.0, max_tokens=2))
        assert sorted(got) == [0, 1, 2, 3]
    finally:
        engine.stop()


async def test_a_fork_that_fails_fails_its_request_alone(tiny_dirs, monkeypatch):
    engine = start_engine(tiny_dirs["tiny-text"])
    try:
        def failing(*args):  # what a key/value buffer that cannot grow raises
            raise RuntimeError("out of memory")

        monkeypatch.setattr(SlotKV, "fork", failing)
        neighbour = _request(random_ids(5, seed=4), {}, "neighbour", temperature=0.0, ignore_eos=True, max_tokens=12)
        alone, _ = await collect(engine, neighbour)
        outputs = engine.generate(neighbour)
        got = list((await anext(outputs)).token_ids)
        with pytest.raises(RuntimeError, match="out of memory"):
            await _choices(engine, _request(random_ids(9, seed=8), {}, n=3, **SAMPLED))
        got += [t async for out in outputs for t in out.token_ids]
        assert got == alone  # the running request went on untouched
        monkeypatch.undo()  # (the buffers grow again)
        assert sorted((await _choices(engine, _request([1, 2, 3], {}, n=2, **SAMPLED)))[0]) == [0, 1]
        assert engine.num_running == 0 and engine.scheduler.reserved == 0 and not engine.requests
    finally:
        engine.stop()
