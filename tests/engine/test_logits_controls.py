"""Penalties and masks on a batch equal HF's own logits processors row by row (presence and frequency: vLLM's
formula), over several steps of a growing output; rows without controls are untouched."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from engine.logits_controls import LogitsControls
from engine.sampler import below_min_p, make_generator, sample
from engine.sequence import Sequence
from splice.sampling import SamplingParams

CPU = torch.device("cpu")
VOCAB = 40
EOS = (2, 3)
PROMPTS = [[5, 6, 7, 5, 30], [8, 9, 10], [11, 12, 13, 14], [7, 7, 20]]


def _logits(rows: int, step: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(100 + step)) * 4  # [rows, vocab]


def _seqs(params: list[SamplingParams]) -> tuple[LogitsControls, list[Sequence]]:
    controls = LogitsControls(CPU)
    seqs = [Sequence(f"r{i}", len(PROMPTS[i]), p, 512, EOS) for i, p in enumerate(params)]
    for seq, prompt in zip(seqs, PROMPTS, strict=False):
        controls.start(seq, prompt)
    return controls, seqs


def _run(params: list[SamplingParams], reference, steps: int = 6, script: list[list[int]] | None = None) -> None:
    """Decodes `steps` steps: each step's controlled logits must equal reference(row, input_ids, output, logits) for
    each row, where input_ids = the prompt then the output (HF's input_ids). Tokens are drawn from a fixed
    generator so that outputs repeat tokens, or taken from `script` (one list of the rows' tokens per step)."""
    controls, seqs = _seqs(params)
    g = torch.Generator().manual_seed(7)
    for step in range(steps):
        raw = _logits(len(seqs), step)
        got = controls.apply(raw, seqs)
        for i, seq in enumerate(seqs):
            ids = torch.tensor([PROMPTS[i] + seq.output_ids])
            want = reference(i, ids, seq.output_ids, raw[i:i + 1].clone())[0]
            torch.testing.assert_close(got[i], want, rtol=0, atol=1e-5, msg=f"row {i} step {step}")
        tokens = script[step] if script else torch.randint(4, 16, (len(seqs),), generator=g).tolist()
        controls.record(seqs, tokens)
        for seq, t in zip(seqs, tokens, strict=True):
            seq.append(t)


def test_repetition_penalty_is_hfs_over_prompt_and_output():
    penalties = [1.3, 0.7, 1.0, 2.0]
    params = [SamplingParams(repetition_penalty=p) for p in penalties]
    _run(params, lambda i, ids, out, x: RepetitionPenaltyLogitsProcessor(penalties[i])(ids, x))


def test_frequency_and_presence_are_vllms_over_output_tokens_only():
    pairs = [(0.5, 0.0), (0.0, 1.5), (-1.0, 2.0), (2.0, -2.0)]  # (frequency, presence)
    params = [SamplingParams(frequency_penalty=f, presence_penalty=p) for f, p in pairs]

    def vllm(i, ids, out, x):
        count = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=VOCAB).float()
        return x - pairs[i][0] * count - pairs[i][1] * (count > 0).float()

    _run(params, vllm)


def test_logit_bias_is_hfs_sequence_bias_of_single_tokens():
    biases = [{4: 5.0, 9: -100.0}, {}, {0: 100.0}, {39: -3.5, 4: 0.25}]
    params = [SamplingParams(logit_bias=b) for b in biases]

    def hf(i, ids, out, x):
        if not biases[i]:
            return x
        return SequenceBiasLogitsProcessor([[[t], b] for t, b in biases[i].items()])(ids, x)

    _run(params, hf)


def test_allowed_token_ids_keep_only_those_tokens():
    allowed = [[4, 5, 6], [], [39], list(range(0, 40, 3))]
    params = [SamplingParams(allowed_token_ids=tuple(a)) for a in allowed]

    def hf(i, ids, out, x):
        if not allowed[i]:
            return x
        return PrefixConstrainedLogitsProcessor(lambda batch, sent: allowed[i], num_beams=1)(ids, x)

    _run(params, hf)


def _output_only(out: list[int]) -> torch.Tensor:
    """HF's input_ids for vLLM's bad words, which match the output only, never the prompt: the output after one ID
    that matches nothing (HF skips a word longer than its input_ids; vLLM needs only its prefix generated)."""
    return torch.tensor([[10_000, *out]], dtype=torch.long)


def test_bad_words_are_hfs_on_the_output_with_multi_token_words_banned_after_their_prefix():
    words = [[(9,), (4, 5), (5, 4, 6)], [(4, 4)], [], [(6, 7, 8, 9)]]
    params = [SamplingParams(bad_words_token_ids=w) for w in words]
    # outputs that walk into the prefixes: 4 then 5?, 5 4 then 6?, 4 4?, 6 7 8 then 9?
    script = [[4, 5, 4, 4], [5, 4, 7, 6], [4, 4, 6, 7], [6, 4, 6, 8], [7, 9, 7, 9], [8, 4, 8, 5]]

    def hf(i, ids, out, x):
        if not words[i]:
            return x
        return NoBadWordsLogitsProcessor([list(w) for w in words[i]])(_output_only(out), x)

    _run(params, hf, steps=len(script), script=script)


def test_min_tokens_bans_eos_and_stop_ids_until_enough_tokens():
    mins = [3, 0, 5, 1]
    params = [SamplingParams(min_tokens=m, stop_token_ids=(17,) if i == 2 else ()) for i, m in enumerate(mins)]

    def hf(i, ids, out, x):
        stops = [*EOS, 17] if i == 2 else list(EOS)
        return MinNewTokensLengthLogitsProcessor(len(PROMPTS[i]), mins[i], stops)(ids, x)

    _run(params, hf, steps=7)


def test_all_controls_together_are_hfs_chain_in_vllms_order():
    p = SamplingParams(repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2, min_tokens=2,
                       logit_bias={4: 2.0, 5: -1.0}, allowed_token_ids=tuple(range(2, 20)),
                       bad_words_token_ids=((8,), (4, 6)))
    plain = SamplingParams()

    def hf(i, ids, out, x):
        if i == 1:
            return x
        chain = LogitsProcessorList([
            PrefixConstrainedLogitsProcessor(lambda batch, sent: list(range(2, 20)), num_beams=1),
            SequenceBiasLogitsProcessor([[[8], float("-inf")]]),
            MinNewTokensLengthLogitsProcessor(len(PROMPTS[i]), 2, list(EOS)),
            SequenceBiasLogitsProcessor([[[4], 2.0], [[5], -1.0]]),
            RepetitionPenaltyLogitsProcessor(1.4),
        ])
        x = chain(ids, x)
        x = NoBadWordsLogitsProcessor([[4, 6]])(_output_only(out), x)
        count = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=VOCAB).float()
        return x - 0.3 * count - 0.2 * (count > 0).float()

    _run([p, plain, p], hf, steps=8)


def test_a_batch_without_controls_is_returned_as_it_came():
    controls, seqs = _seqs([SamplingParams(temperature=0.7, top_p=0.9), SamplingParams()])
    x = _logits(2, 0)
    assert controls.apply(x, seqs) is x


def test_released_rows_are_reused_clean():
    controls = LogitsControls(CPU)
    first = Sequence("a", 2, SamplingParams(frequency_penalty=1.0), 512)
    controls.start(first, [1, 2])
    controls.apply(_logits(1, 0), [first])
    controls.record([first], [5])
    row = first.controls.penalty
    controls.release(first)
    assert first.controls is None
    second = Sequence("b", 2, SamplingParams(frequency_penalty=1.0), 512)
    controls.start(second, [1, 2])
    x = _logits(1, 1)
    torch.testing.assert_close(controls.apply(x, [second]), x)  # nothing generated yet: nothing to subtract
    assert second.controls.penalty == row


def test_a_row_whose_every_token_is_banned_keeps_its_logits():
    # allowed {4, 5}; after a 4, the bad words "4 4" and "4 5" ban both
    p = SamplingParams(allowed_token_ids=(4, 5), bad_words_token_ids=((4, 4), (4, 5)))
    controls, seqs = _seqs([p])
    controls.apply(_logits(1, 0), seqs)
    seqs[0].append(4)
    x = _logits(1, 1)
    torch.testing.assert_close(controls.apply(x, seqs), x)


@pytest.mark.parametrize("min_p", [0.0, 0.05, 0.3, 1.0])
def test_min_p_is_hfs_min_p_warper(min_p):
    x = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    x = x - x.amax(-1, keepdim=True)  # as the sampler hands it over: each row's top logit at 0
    got = x.masked_fill(below_min_p(x, [min_p] * 3), float("-inf"))
    want = MinPLogitsWarper(min_p)(torch.zeros(3, 1, dtype=torch.long), x.clone()) if min_p else x
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got[~got.isinf()], x[~got.isinf()])


def test_min_p_bounds_what_sampling_draws_and_greedy_ignores_it():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    g = make_generator(0, CPU)
    p = SamplingParams(temperature=1.0, min_p=0.25)  # keeps p >= 0.125: tokens 0 and 1
    assert {sample(x, [p], [g])[0][0] for _ in range(300)} == {0, 1}
    assert sample(x, [SamplingParams(temperature=0.0, min_p=1.0)], [g])[0] == [0]


def test_logprobs_come_from_the_raw_logits():
    raw = _logits(1, 0)
    controlled = raw.clone()
    controlled[0, 5] = 1e3
    tokens, lps, _ = sample(controlled, [SamplingParams(temperature=0.0, logprobs=True)], [make_generator(0, CPU)],
                            raw=raw)
    assert tokens == [5] and abs(lps[0] - raw.log_softmax(-1)[0, 5].item()) < 1e-6
