"""Structured outputs through the engine on the random-weight tiny text model: sampled at temperature 1, every output
follows its grammar and ends (stop, never length); a grammar compiling holds only its own request."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import threading

import jsonschema
import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from splice.engine_output import FinishReason
from splice.errors import InvalidArgument
from splice.grammar import spec_key
from splice.grammar_cache import GrammarCache
from splice.structured_output import StructuredOutput
from tests.engine.engine_factories import collect, random_ids, text_request, with_embed_span

SCHEMA = {"type": "object", "properties": {
    "colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 6}},
    "required": ["colour", "count", "ok", "name"], "additionalProperties": False}
# xgrammar's JSON strings (as vLLM's) admit raw control characters, which a random model's byte tokens produce and
# json.loads refuses unless told not to be strict
SAMPLED = dict(temperature=1.0, ignore_eos=False, max_tokens=120)


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    return AutoTokenizer.from_pretrained(tiny_dirs["tiny-text"])


async def _text(engine, tokenizer, so: StructuredOutput, seed: int, **sampling) -> tuple[str, FinishReason]:
    ids, outs = await collect(engine, text_request(random_ids(8, seed), f"s{seed}", structured=so, seed=seed,
                                                   **{**SAMPLED, **sampling}))
    return tokenizer.decode(ids, skip_special_tokens=True), outs[-1].finish_reason


@pytest.mark.parametrize("seed", range(4))
async def test_sampled_json_follows_its_schema_and_stops(text_engine, tokenizer, seed):
    text, reason = await _text(text_engine, tokenizer, StructuredOutput("json", json.dumps(SCHEMA)), seed)
    assert reason is FinishReason.STOP, text
    jsonschema.validate(json.loads(text, strict=False), SCHEMA)


async def test_json_object_choice_and_regex_outputs_match_exactly(text_engine, tokenizer):
    choices = ["alpha", "beta gamma", 'say "hi"']
    for seed in range(3):
        text, reason = await _text(text_engine, tokenizer, StructuredOutput("choice", json.dumps(choices)), seed)
        assert reason is FinishReason.STOP and text in choices
        text, reason = await _text(text_engine, tokenizer, StructuredOutput("regex", r"[a-c]{2,4}-\d\d"), seed)
        assert reason is FinishReason.STOP and re.fullmatch(r"[a-c]{2,4}-\d\d", text), text
        text, reason = await _text(text_engine, tokenizer, StructuredOutput("grammar", 'root ::= "x" ("y" | "z")'),
                                   seed)
        assert reason is FinishReason.STOP and text in ("xy", "xz")


async def test_a_constrained_row_beside_free_rows_in_one_batch(text_engine, tokenizer):
    so = StructuredOutput("json", json.dumps(SCHEMA))
    free = [text_request(random_ids(6, 40 + k), f"f{k}", temperature=1.0, seed=k, max_tokens=20) for k in range(3)]
    results = await asyncio.gather(_text(text_engine, tokenizer, so, 7), *(collect(text_engine, r) for r in free))
    text, reason = results[0]
    assert reason is FinishReason.STOP
    jsonschema.validate(json.loads(text, strict=False), SCHEMA)
    assert all(len(ids) == 20 for ids, _ in results[1:])


async def test_max_tokens_cuts_a_grammar_with_length(text_engine, tokenizer):
    text, reason = await _text(text_engine, tokenizer, StructuredOutput("json", json.dumps(SCHEMA)), 1, max_tokens=3)
    assert reason is FinishReason.LENGTH and text.startswith("{")


async def test_logprobs_are_of_the_masked_distribution(text_engine):
    # one allowed string: a step whose only allowed token is forced has logprob 0 (vLLM: the mask comes first)
    req = text_request(random_ids(8, 3), "lp", structured=StructuredOutput("grammar", 'root ::= "zz"'),
                       temperature=1.0, seed=3, max_tokens=20, logprobs=True, ignore_eos=False)
    _ids, outs = await collect(text_engine, req)
    logprobs = [lp for o in outs for lp in o.logprobs]
    assert outs[-1].finish_reason is FinishReason.STOP and logprobs[-1] == pytest.approx(0.0, abs=1e-5)


async def test_invalid_specs_are_refused(text_engine):
    for so in (StructuredOutput("regex", "(ab"), StructuredOutput("json", '{"type": "bogus"}'),
               StructuredOutput("grammar", "root ::= nothing")):
        with pytest.raises(InvalidArgument, match=so.kind):
            await collect(text_engine, text_request([5, 6, 7], structured=so, max_tokens=4))


def _hold_workers(cache, gate: threading.Event) -> list:
    """Every compile worker of `cache` busy with a job that waits for `gate` (returns once each has started)."""
    jobs = [cache._job(f"gate-{i}", 0, gate.wait) for i in range(cache.workers)]
    for job in jobs:
        job.began.result(timeout=60)
    return jobs


def _chain(tag: str, rules: int = 1500) -> StructuredOutput:
    """An EBNF whose rules call one another in a chain: tens of ms to compile for the tiny vocabulary."""
    return StructuredOutput("grammar", "\n".join([f'root ::= "{tag}" r0'] + [f'r{i} ::= "a{i}" | "b" r{i + 1}'
                                                                            for i in range(rules - 1)]
                                                 + [f'r{rules - 1} ::= "end"']))


async def test_a_compiling_grammar_holds_only_its_own_request(text_engine, tokenizer):
    """The compile workers are held busy (gates queued ahead of the grammar): a free request completes meanwhile, the
    constrained one waits, then completes once its grammar is compiled."""
    cache = text_engine._grammar_cache()
    gate = threading.Event()
    held = _hold_workers(cache, gate)
    so = StructuredOutput("regex", r"wait-[0-9]{3}")
    waiting = asyncio.create_task(_text(text_engine, tokenizer, so, 2))
    try:
        ids, _outs = await collect(text_engine, text_request(random_ids(6, 9), "free", max_tokens=12))
        assert len(ids) == 12 and not waiting.done() and not any(j.done.done() for j in held)
    finally:
        gate.set()
    text, reason = await waiting
    assert reason is FinishReason.STOP and re.fullmatch(r"wait-[0-9]{3}", text)


async def test_the_compile_budget_counts_from_its_own_start(text_engine, tokenizer):
    """A request queued behind other compiles for longer than its budget is not refused for their time: once a worker
    takes it, its own compile fits its budget and it is served (before: refused as "took longer" after the budget,
    spent waiting). A wait cancelled while queued takes its job with it."""
    cache = text_engine._grammar_cache()
    gate = threading.Event()
    before, cache.timeout_s = cache.timeout_s, 2.0
    try:
        _hold_workers(cache, gate)
        so = StructuredOutput("regex", r"queued-[0-9]{2}")
        waiting = asyncio.create_task(_text(text_engine, tokenizer, so, 3))
        while not (job := cache._jobs.get(spec_key(so))) or not job.waiters:
            await asyncio.sleep(0.01)
        cancelled = asyncio.create_task(collect(text_engine, text_request(
            [5, 6], "c", structured=StructuredOutput("regex", "cancel[0-9]"), max_tokens=4)))
        while spec_key(StructuredOutput("regex", "cancel[0-9]")) not in cache._jobs:
            await asyncio.sleep(0.01)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert spec_key(StructuredOutput("regex", "cancel[0-9]")) not in cache._jobs  # (dropped from the queue)
        await asyncio.sleep(cache.timeout_s * 1.5)  # queued longer than its whole budget
        assert not waiting.done()
        gate.set()
        text, reason = await waiting
        assert reason is FinishReason.STOP and re.fullmatch(r"queued-[0-9]{2}", text)
        assert text_engine.num_running == 0 and text_engine.num_waiting == 0
    finally:
        cache.timeout_s = before
        gate.set()


async def test_a_compile_past_its_own_budget_is_refused_naming_the_flag(text_engine):
    cache = text_engine._grammar_cache()
    before, cache.timeout_s = cache.timeout_s, 0.001  # less than any compile of a 1500-rule chain
    try:
        with pytest.raises(InvalidArgument, match=r"took longer than 0\.001 s to compile "
                                                  r"\(--structured-compile-timeout"):
            await collect(text_engine, text_request([5, 6], structured=_chain("late"), max_tokens=4))
    finally:
        cache.timeout_s = before
    ids, outs = await collect(text_engine, text_request([5, 6], structured=StructuredOutput("regex", "late[0-9]"),
                                                        max_tokens=8, ignore_eos=False))
    assert outs[-1].finish_reason is FinishReason.STOP and len(ids) >= 2


async def test_a_small_schema_is_not_held_behind_large_grammars(text_engine, tokenizer):
    """Issue 40 row 5: four large grammars at once, then another user's small schema: it is compiled before the large
    ones still queued (the queue is cheapest-first by spec length, aged), so its answer comes before theirs. Before:
    one compile thread in arrival order, and the small one waited for all four."""
    done: list[str] = []

    async def ask(so: StructuredOutput, name: str, seed: int) -> None:
        await _text(text_engine, tokenizer, so, seed, max_tokens=4)
        done.append(name)

    large = [asyncio.create_task(ask(_chain(f"big{i}", 2000), f"big{i}", i)) for i in range(4)]
    cache = text_engine._grammar_cache()
    while len(cache._jobs) < 4 and not any(t.done() for t in large):
        await asyncio.sleep(0.005)
    small = StructuredOutput("json", json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}}))
    await asyncio.gather(ask(small, "small", 9), *large)
    assert done.index("small") < 3, done  # at most the two compiling when it came finished first


async def test_compiled_grammars_are_kept_within_their_byte_budget(tiny_dirs):
    """Issue 40 row 4: the cache keeps compiled grammars within --structured-cache-mb, least recently used evicted
    first, and a grammar whose compiled size alone passes it is refused, naming its size and the flag."""
    tok = AutoTokenizer.from_pretrained(tiny_dirs["tiny-text"])
    cache = GrammarCache(lambda: tok, len(tok), max_bytes=512 << 10)
    try:
        specs = [_chain(f"c{i}", 100) for i in range(10)]  # ~130 KiB each compiled
        sizes = []
        for so in specs:
            sizes.append((await cache.get(so)).memory_size_bytes)
            assert cache.bytes <= cache.max_bytes
        assert cache.bytes == sum(g.memory_size_bytes for g in cache._kept.values())
        kept = [so for so in specs if spec_key(so) in cache._kept]
        assert 0 < len(kept) < len(specs) and kept == specs[len(specs) - len(kept):]  # the most recent ones
        big = _chain("huge", 1500)  # ~2 MiB compiled
        with pytest.raises(InvalidArgument, match=r"structured output grammar compiles to [\d.]+ MiB .* "
                                                  r"\(--structured-cache-mb\)"):
            await cache.get(big)
        assert spec_key(big) not in cache._kept and cache.bytes <= cache.max_bytes
    finally:
        cache.close()


async def test_a_refused_grammar_is_not_kept_alive(tiny_dirs):
    """Issue 40 row 4: a grammar refused for its compiled size leaves nothing compiled behind, asked once or again.
    Before: the refusal raised in the compile kept its traceback, whose frames held the compiled grammar, in the cache
    of refusals (256 kept), and each later ask of the same spec chained the asker's frames on: the hostile soak's
    large grammars took the engine's RSS from 479 to 2,048 MiB."""
    tok = AutoTokenizer.from_pretrained(tiny_dirs["tiny-text"])
    cache = GrammarCache(lambda: tok, len(tok), max_bytes=64 << 10)

    def alive() -> list[xgr.CompiledGrammar]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, xgr.CompiledGrammar)]

    try:
        before = alive()  # (held: other tests' grammars, which may go meanwhile, are not counted as new)
        for so in [_chain(f"big{i}", 200) for i in range(3)] * 2:
            with pytest.raises(InvalidArgument, match=r"\(--structured-cache-mb\)"):
                await cache.get(so)
        assert len(cache._failed) == 3 and not cache._kept
        assert [o for o in alive() if not any(o is b for b in before)] == []
    finally:
        cache.close()


async def test_supplied_prompt_embeddings_with_a_grammar(text_engine, tokenizer):
    ids = random_ids(10, seed=12)
    rows = text_engine.m.embed.weight[ids[2:5]].detach().clone()  # three positions supplied as rows
    req = with_embed_span(ids[:2] + ids[5:], {}, 2, rows, "embeds", temperature=1.0, seed=1, max_tokens=40,
                          ignore_eos=False, structured=StructuredOutput("choice", '["north", "south"]'))
    got, outs = await collect(text_engine, req)
    assert outs[-1].finish_reason is FinishReason.STOP
    assert tokenizer.decode(got, skip_special_tokens=True) in ("north", "south")


async def test_a_structural_tag_is_followed(text_engine, tokenizer):
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "content": {
        "type": "json_schema", "json_schema": {"enum": ["A", "B"]}}, "end": "</f>"}}
    for seed in range(3):
        text, reason = await _text(text_engine, tokenizer, StructuredOutput("structural_tag", json.dumps(tag)), seed)
        assert reason is FinishReason.STOP and text in ('<f>"A"</f>', '<f>"B"</f>')


async def test_each_of_n_choices_follows_the_grammar_with_its_own_matcher(text_engine, tokenizer):
    so = StructuredOutput("json", json.dumps(SCHEMA))
    req = text_request(random_ids(8, 21), "n4", structured=so, n=4, seed=5, **SAMPLED)
    _, outs = await collect(text_engine, req)
    by_choice: dict[int, list[int]] = {}
    ends = {}
    for out in outs:
        by_choice.setdefault(out.index, []).extend(out.token_ids)
        if out.finished:
            ends[out.index] = out.finish_reason
    assert sorted(by_choice) == [0, 1, 2, 3] and set(ends.values()) == {FinishReason.STOP}
    answers = [tokenizer.decode(ids, skip_special_tokens=True) for ids in by_choice.values()]
    for text in answers:
        jsonschema.validate(json.loads(text, strict=False), SCHEMA)
    assert len(set(answers)) > 1  # (each choice samples with its own seed)


async def test_json_allows_any_whitespace_unless_disabled(tokenizer):
    """xgrammar's default and vLLM's: any whitespace JSON allows between tokens; disable_any_whitespace (vLLM's switch:
    a server flag, a request's structured_outputs field) allows none, "," and ":" the separators."""
    import xgrammar as xgr

    from splice.grammar_cache import GrammarCache

    cache = GrammarCache(lambda: tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    spaced = ('{ "city" : "Paris" }', '{\n"city": "Paris"\n}', '{"city": "Paris"}')
    for kind, spec in (("json", schema), ("json_object", "")):
        for disabled in (False, True):
            compiled = await cache.get(StructuredOutput(kind, spec, disabled))
            assert xgr.GrammarMatcher(compiled).accept_string('{"city":"Paris"}')
            assert [xgr.GrammarMatcher(compiled).accept_string(s) for s in spaced] == [not disabled] * 3
    cache.close()
