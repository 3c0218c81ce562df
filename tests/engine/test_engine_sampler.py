"""Sampler on hand-made logits: the properties each control promises."""

from __future__ import annotations

import pytest
import torch

from engine.sampler import make_generator, sample
from splice.sampling import SamplingParams

CPU = torch.device("cpu")


def logits(rows: int = 3, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def gens(n: int, seed: int | None = 0):
    return [make_generator(seed, CPU) for _ in range(n)]


def test_greedy_is_argmax_and_logprobs_are_the_raw_distribution():
    x = logits()
    toks, lps, _ = sample(x, [SamplingParams(temperature=0.0, logprobs=True)] * 3, gens(3))
    assert toks == x.argmax(-1).tolist()
    want = x.log_softmax(-1).max(-1).values.tolist()
    assert all(abs(a - b) < 1e-6 for a, b in zip(lps, want, strict=True))
    assert sample(x, [SamplingParams(temperature=0.0)] * 3, gens(3))[1] == [None] * 3


def test_same_seed_same_draws_different_seed_different_draws():
    x = logits(1, 1000)
    p = [SamplingParams(temperature=1.0)]
    draw = lambda seed: [sample(x, p, [g])[0][0] for g in [make_generator(seed, CPU)] for _ in range(20)]  # noqa: E731
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_a_rows_draw_does_not_depend_on_its_neighbours():
    x = logits(4)
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=3)
    alone = sample(x[2:3], [p], [make_generator(3, CPU)])[0][0]
    mixed = sample(x, [SamplingParams(temperature=1.0)] * 2 + [p, SamplingParams(temperature=0.0)],
                   [make_generator(s, CPU) for s in (10, 11, 3, 12)])[0][2]
    assert alone == mixed


def test_top_k_limits_the_support():
    x = logits(1, 50)
    top3 = set(torch.topk(x[0], 3).indices.tolist())
    g = make_generator(0, CPU)
    seen = {sample(x, [SamplingParams(temperature=5.0, top_k=3)], [g])[0][0] for _ in range(200)}
    assert seen <= top3 and len(seen) > 1
    g = make_generator(0, CPU)
    assert sample(x, [SamplingParams(temperature=5.0, top_k=1)], [g])[0] == x.argmax(-1).tolist()


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = make_generator(0, CPU)
    seen = {sample(x, [SamplingParams(temperature=1.0, top_p=0.7)], [g])[0][0] for _ in range(300)}
    assert seen == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops there
    g = make_generator(0, CPU)
    assert {sample(x, [SamplingParams(temperature=1.0, top_p=0.1)], [g])[0][0] for _ in range(50)} == {0}


def test_temperature_sharpens():
    x = logits(1, 20)
    g = make_generator(1, CPU)
    cold = [sample(x, [SamplingParams(temperature=0.01)], [g])[0][0] for _ in range(50)]
    assert set(cold) == {int(x.argmax())}


@pytest.mark.parametrize("temperature", [1e-45, 1e-7, 1e-4])
def test_tiny_temperatures_never_produce_nan(temperature):
    # logits with a wide range: dividing by a tiny temperature without shifting would overflow to inf
    logits = torch.linspace(-30.0, 30.0, 50)[None].repeat(2, 1)
    params = [SamplingParams(temperature=temperature, seed=1), SamplingParams(temperature=0.0)]
    tokens, _, _ = sample(logits, params, [make_generator(1, CPU), make_generator(2, CPU)])
    assert tokens == [int(logits[0].argmax()), int(logits[1].argmax())]


def test_top_logprobs_are_each_rows_k_most_likely_of_the_raw_distribution():
    x = logits(3, 50)
    params = [SamplingParams(temperature=0.0, logprobs=True, top_logprobs=5), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.7, logprobs=True, top_logprobs=2)]
    _, lps, tops = sample(x, params, gens(3))
    want = x.log_softmax(-1).topk(5, dim=-1)
    assert tops[1] is None and lps[1] is None
    for row, k in ((0, 5), (2, 2)):
        ids, values = tops[row]
        assert list(ids) == want.indices[row, :k].tolist()
        assert all(abs(a - b) < 1e-6 for a, b in zip(values, want.values[row, :k].tolist(), strict=True))
    assert tops[0][0][0] == int(x[0].argmax())  # greedy: the chosen token leads the list


def test_batched_draws_follow_each_rows_own_distribution():
    """Rows of different temperatures, top-k and top-p drawn together, step after step: each row's tokens come at its
    distribution's frequencies (total variation within sampling noise), and only from its support."""
    from engine.sampler import top_k_top_p

    x = logits(6, 40, seed=4)
    params = [SamplingParams(temperature=0.5 + 0.2 * k, seed=k, top_k=5 if k % 3 == 0 else 0,
                             top_p=0.8 if k % 3 == 1 else 1.0) for k in range(6)]
    want = torch.stack([top_k_top_p((x[r] - x[r].max()) / p.temperature, p).softmax(-1)
                        for r, p in enumerate(params)])
    counts = torch.zeros_like(want)
    generators, draws = gens(6), 4000
    for _ in range(draws):
        counts[torch.arange(6), torch.tensor(sample(x, params, generators)[0])] += 1
    seen = counts / draws
    assert bool((seen[want == 0] == 0).all())
    distance = (seen - want).abs().sum(-1) / 2  # per row
    assert distance.max() < 0.04, distance
