"""What must hold for every model family (tiny random-weight models, CPU), one parametrized suite:

- greedy tokens for a text + image chat, and for text only, equal HF's own `generate` on the processor's output;
- embedding rows of a text's tokens sent as prompt_embeds give the text's tokens;
- a mixed request built by the preprocessor (text + two embeds spans of different lengths + image) carries no
  sentinel ID, and its spans and image rows land where HF puts them (first-step logits equal HF's forward);
- 8 concurrent requests of different lengths, joining and leaving at different steps, give their solo tokens;
- the encoder cache: re-sent pictures (A, B then A, B, C; a picture twice in one request; the same request again)
  give the tokens the engine gives without it, counted as hits where the family keys pictures apart; a picture
  one value apart misses; a budget that holds about one entry evicts and still gives the same tokens;
- a malformed image tensor is INVALID_ARGUMENT naming it, and the engine keeps serving;
- the prefix cache: chats with prompt embeds and pictures (repeated, a second turn, rows or a picture apart) give
  the tokens of an empty cache, and hit exactly the whole blocks before their first difference.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.encoder_cache import EncoderCache, content_key
from engine.models.base import ModelFamily
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from splice.engine_request import NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, text_request, with_embed_span
from tests.engine.family_cases import CASES, FamilyCase
from tests.engine.runner_rows import Rows
from tests.preprocessor.pp_factories import conversation, png_bytes, rows

N = 10  # generated tokens compared
GREEDY = dict(temperature=0.0)



def _ids(case: FamilyCase):
    return pytest.param(case, id=case.tiny)


ALL = [_ids(c) for c in CASES]
VISION = [_ids(c) for c in CASES if c.images]


def _request(ids, tensors, request_id="r", **sampling):
    from splice.engine_request import EngineRequest

    return EngineRequest(request_id, list(ids), tensors=[NamedTensor(k, v) for k, v in tensors.items()],
                         sampling=SamplingParams(**{**GREEDY, **sampling}))


@pytest.mark.parametrize("case", VISION)
async def test_text_and_image_greedy_equals_hf_generate(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, tensors = case.inputs(tiny_dirs[case.tiny])
    got, _ = await collect(engine, _request(ids, tensors, max_tokens=N))
    assert got == case.hf_generate(engine.m.model, ids, tensors, N)


@pytest.mark.parametrize("case", ALL)
async def test_text_only_greedy_equals_hf_generate(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, _ = case.inputs(tiny_dirs[case.tiny], "Tell me a story about a cat.", images=0)
    got, _ = await collect(engine, _request(ids, {}, max_tokens=N))
    assert got == case.hf_generate(engine.m.model, ids, {}, N)


@pytest.mark.parametrize("case", ALL)
async def test_embedding_rows_of_a_text_act_as_the_text(case, engines, tiny_dirs):
    if not case.embeds_act_as_text:
        pytest.skip(case.equivalence_note)
    engine = engines(case.tiny)
    ids, _ = case.inputs(tiny_dirs[case.tiny], "The color is purple and the sky is wide.", images=0)
    with torch.inference_mode():
        looked_up = engine.m.embed(torch.tensor(ids)).clone()  # [P, hidden]: the rows the model itself uses
    as_text, _ = await collect(engine, _request(ids, {}, max_tokens=N, ignore_eos=True))
    a, b = 2, len(ids) - 3  # a middle part supplied, the rest as text; then the whole prompt supplied
    part = with_embed_span(ids[:a] + ids[b:], {}, a, looked_up[a:b], max_tokens=N, ignore_eos=True)
    whole = with_embed_span([], {}, 0, looked_up, max_tokens=N, ignore_eos=True)
    assert (await collect(engine, part))[0] == as_text
    assert (await collect(engine, whole))[0] == as_text


@pytest.mark.parametrize("case", VISION)
async def test_mixed_request_from_the_preprocessor_lands_where_hf_puts_it(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    files = load_model_files(tiny_dirs[case.tiny])
    info = engine.info
    core = PreprocessorCore(files, info)
    a, b = rows(3, info.hidden_size, seed=1), rows(5, info.hidden_size, seed=2)
    conv = conversation(("user", ["Soft prompt:", a, png_bytes(*case.picture_size), "and", b, "Describe."]))
    req = core.normalize_chat(conv, SamplingParams(temperature=0.0, max_tokens=1)).request
    assert not set(req.token_ids) & files.sentinels.id_set and max(req.token_ids) < info.vocab_rows
    assert [s.length for s in req.embed_spans] == [3, 5]
    assert sum(t == info.image_token_id for t in req.token_ids) > 0
    # HF's own merge: the prompt rows with the supplied rows written at the spans; HF writes its image features
    with torch.inference_mode():
        x = engine.m.embed(torch.tensor(req.token_ids)).clone()  # [P, hidden]
        for span in req.embed_spans:
            x[span.offset:span.offset + span.length] = req.span_rows(span)
        want = case.hf_first_logits(engine.m.model, req.token_ids, x, req.model_inputs)
        got = Rows(engine.m.family).prefill([0], [engine.m.family.prompt(req)])[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    tokens, _ = await collect(engine, req)
    assert tokens == [int(want.argmax())]


@pytest.mark.parametrize("case", ALL)
async def test_eight_concurrent_requests_give_their_solo_tokens(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    reqs = []
    for k in range(8):
        text = "word " * (3 + 5 * k)
        images = 1 if case.images and k % 3 == 0 else 0
        ids, tensors = case.inputs(tiny_dirs[case.tiny], text, images=images, shift=k)
        reqs.append(_request(ids, tensors, f"r{k}", max_tokens=4 + 3 * k, ignore_eos=True))
    solo = [(await collect(engine, r))[0] for r in reqs]

    async def staggered(k, r):
        await asyncio.sleep(0.02 * k)  # join while others decode; different max_tokens leave at different steps
        return (await collect(engine, r))[0]

    together = await asyncio.gather(*(staggered(k, r) for k, r in enumerate(reqs)))
    assert list(together) == solo


@pytest.mark.parametrize("case", VISION)
async def test_a_malformed_image_tensor_is_invalid_argument_naming_it(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, tensors = case.inputs(tiny_dirs[case.tiny])
    name, pixels = next(iter(tensors.items()))
    for bad in (pixels[..., :-1], pixels.flatten()[: pixels.numel() // 2]):
        with pytest.raises(InvalidArgument, match=name):
            await collect(engine, _request(ids, {**tensors, name: bad.clone()}))
    assert len((await collect(engine, text_request(ids[:4], max_tokens=2)))[0]) == 2


def _encoder_counts() -> tuple[float, float]:
    """(queries, hits) as the engine's metrics count them so far."""
    from prometheus_client import REGISTRY

    return tuple(REGISTRY.get_sample_value(f"splice_engine_encoder_cache_{n}_total") or 0.0
                 for n in ("queries", "hits"))


def _one_value_apart(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same picture with its first pixel value moved (inside a real patch or tile of every family)."""
    pv = tensors["pixel_values"].clone()
    pv.view(-1)[0] += 0.25
    return {**tensors, "pixel_values": pv}


@pytest.mark.parametrize("case", VISION)
async def test_encoder_cache_gives_the_uncached_tokens_and_counts_hits(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    family = engine.m.family
    d = tiny_dirs[case.tiny]
    turns = [case.inputs(d, shifts=(0, 40)), case.inputs(d, "And now?", shifts=(0, 40, 80)),
             case.inputs(d, shifts=(120, 120)), case.inputs(d, shifts=(0, 40))]
    a = case.inputs(d, shifts=(0,))
    turns += [a, (a[0], _one_value_apart(a[1]))]
    reqs = [_request(ids, t, f"t{k}", max_tokens=6, ignore_eos=True) for k, (ids, t) in enumerate(turns)]
    kept = family.encoder_cache
    try:
        family.encoder_cache = None
        uncached = [(await collect(engine, r))[0] for r in reqs]
        cache = family.encoder_cache = EncoderCache(64 << 20)
        seen: set[str] = set()
        for req, want in zip(reqs, uncached, strict=True):
            before = _encoder_counts()
            assert (await collect(engine, req))[0] == want
            keys = [content_key(p) for p in family.image_pieces(req.model_inputs)]
            queries, hits = (after - b for after, b in zip(_encoder_counts(), before, strict=True))
            # a piece is encoded once: the first time it is seen, in this request or an earlier one
            assert (queries, hits) == (len(keys), len(keys) - len(set(keys) - seen))
            seen |= set(keys)
            if req.request_id == "t5":
                assert queries - hits == 1  # one value apart: its piece (picture or tile) is encoded again
        if type(family).image_pieces is not ModelFamily.image_pieces:  # pictures keyed apart: re-sent ones hit
            assert len(family.image_pieces(reqs[1].model_inputs)) >= 3
        assert cache.bytes > 0 and len(cache) == len(seen)
        # a budget of about one entry: entries are evicted, the tokens stay
        small = family.encoder_cache = EncoderCache(max(1, cache.bytes // len(seen)))
        for req, want in zip(reqs, uncached, strict=True):
            assert (await collect(engine, req))[0] == want
        assert small.bytes <= small.budget and len(small) < len(seen)
    finally:
        family.encoder_cache = kept


def _prefix_counts() -> tuple[float, float]:
    """(queries, hits) in prompt positions, as the engine's metrics count them so far."""
    from prometheus_client import REGISTRY

    return tuple(REGISTRY.get_sample_value(f"splice_engine_prefix_cache_{n}_total") or 0.0
                 for n in ("queries", "hits"))


@pytest.mark.parametrize("case", ALL)
async def test_prefix_cache_gives_the_uncached_tokens(case, engines, tiny_dirs):
    """Chats built by the preprocessor (prompt embeds, pictures, a second turn re-sending both): each request's
    tokens with the cache equal its tokens from an empty cache; repeats and second turns hit, requests that differ
    only in embedding rows or in a picture of the same size hit only before the difference."""
    engine = engines(case.tiny)
    info = engine.info
    core = PreprocessorCore(load_model_files(tiny_dirs[case.tiny]), info)
    pic = [png_bytes(*case.picture_size, seed=s) for s in (0, 1)] if case.images else [None, None]

    def chat(rows_seed: int, picture: int, second_turn: bool = False):
        first = ["Soft prompt:", rows(4, info.hidden_size, seed=rows_seed), "then",
                 *([pic[picture]] if case.images else []), "Describe it in a few words, please."]
        turns = [("user", first)]
        if second_turn:
            turns += [("assistant", ["It is a small picture of stripes."]), ("user", ["And again?"])]
        sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        return core.normalize_chat(conversation(*turns), sampling).request

    reqs = {"first": chat(1, 0), "rows apart": chat(2, 0), "picture apart": chat(1, 1),
            "second turn": chat(1, 0, second_turn=True)}
    uncached = {}
    for name, req in reqs.items():
        await engine.reset_prefix_cache()
        uncached[name] = (await collect(engine, req))[0]
    await engine.reset_prefix_cache()
    assert (await collect(engine, reqs["first"]))[0] == uncached["first"]
    size = engine.cfg.block_size
    first = reqs["first"]
    span = first.embed_spans[0]
    image_at = first.token_ids.index(info.image_token_id) if case.images else len(first.token_ids)
    expect = {  # positions each request can take from the cache holding "first" (then its own blocks are kept)
        "first": (first.prompt_len - 1) // size * size,
        "rows apart": span.offset // size * size,
        "picture apart": min(image_at // size * size, (first.prompt_len - 1) // size * size),
        "second turn": first.prompt_len // size * size,
    }
    for name in ("first", "rows apart", "picture apart", "second turn"):
        before = _prefix_counts()
        assert (await collect(engine, reqs[name]))[0] == uncached[name], name
        queries, hits = (after - b for after, b in zip(_prefix_counts(), before, strict=True))
        if engine.prefix is None:  # hybrid recurrent families: served without it
            assert not engine.family.cache.chunkable and (queries, hits) == (0, 0)
            continue
        assert queries == reqs[name].prompt_len
        assert hits == expect[name] if case.tiny != "tiny-gemma3" else hits <= expect[name], name
        assert hits > 0 or name in ("rows apart", "picture apart"), name
