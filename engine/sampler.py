"""Next-token choice for a batch: greedy, temperature, min-p, top-k, top-p, each row with its own generator; and
`Sampler`, which keeps each sequence's sampling state on its record and runs a step's sampling in vLLM's order.

`logits` come in already through engine/logits_controls.py (penalties and masks), which greedy rows follow too;
min-p, top-k and top-p shape only the sampled rows' distribution (after temperature, in vLLM's order). A row's draw
depends only on its logits and its own seeded generator, so a seeded request gives the same tokens alone or in any
batch. Logprobs are of the model's raw distribution (`raw`: before penalties, temperature and filters), as vLLM
reports them by default.
"""

from __future__ import annotations

import math
import random

import torch

from engine.grammar_masks import GrammarMasks
from engine.logits_controls import LogitsControls
from engine.scheduler import StepOutput
from engine.sequence import Sequence
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams

Top = tuple[tuple[int, ...], tuple[float, ...]]  # a row's most likely tokens and their logprobs, most likely first


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else random.getrandbits(63))
    return g


def top_k_top_p(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[vocab] logits with everything outside top-k / top-p set to -inf."""
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p; the top token always stays
        drop_sorted = (probs.cumsum(-1) - probs) >= p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def below_min_p(scaled: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """[rows, vocab] temperature-scaled logits whose row max is 0 -> [rows, vocab] bool: the tokens whose probability
    is below min_p x their row's top probability (HF's MinPLogitsWarper, vLLM's min_p; the top token always stays).
    With the top logit at 0 that ratio is exp(logit), so the test needs no softmax: logit < log(min_p)."""
    return scaled < torch.tensor([math.log(p) if p else -math.inf for p in min_p], device=scaled.device)[:, None]


def inverse_cdf(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """probs [rows, vocab] -> [rows]: each row's token drawn with one uniform number from its own generator, the
    first token whose cumulative probability reaches it (FlashInfer's sampling from probabilities does the same).

    Why not torch.multinomial's draw (argmax of p / q, q ~ Exp(1) over the whole vocabulary): torch's CPU exponential
    costs ~19 ns a number, ~0.9 ms a row for a vocabulary of 49,152, 15 ms of a 16-row decode step of ~100 ms; the
    cumulative sum costs ~0.05 ms a row. The uniform is taken from (0, 1] and scaled by the row's own total (what
    the float sums reach), so the target is above 0 and at most the last cumulative value: a token of probability 0
    (filtered out, or underflowed) has the same cumulative value as the token before it and is never the first to
    reach the target, and a target of the total finds a token."""
    cdf = probs.cumsum(-1)  # [rows, vocab]
    uniform = torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators]).to(probs.device)
    target = (1.0 - uniform) * cdf[:, -1]  # (0, total]
    return torch.searchsorted(cdf, target[:, None])[:, 0].clamp_(max=probs.shape[-1] - 1)


@torch.inference_mode()
def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
           raw: torch.Tensor | None = None) -> tuple[list[int], list[float | None], list[Top | None]]:
    """logits [batch, vocab] -> one token per row, its logprob (from `raw`, default `logits`) for rows that asked,
    and for rows with top_logprobs = k the k most likely tokens and their logprobs (rows with logprob_token_ids: those
    tokens and their logprobs instead)."""
    logits = logits.float()
    chosen = logits.argmax(dim=-1)  # [batch]; kept for greedy rows
    sampled = [row for row, p in enumerate(params) if not p.greedy]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        rows = logits[index]  # [sampled, vocab]
        temps = torch.tensor([params[r].temperature for r in sampled], device=logits.device)[:, None]
        # shifted by the row max first: the largest scaled logit is 0, so no temperature can overflow it
        scaled = (rows - rows.amax(-1, keepdim=True)) / temps
        if any(params[r].min_p for r in sampled):
            scaled = scaled.masked_fill(below_min_p(scaled, [params[r].min_p for r in sampled]), float("-inf"))
        probs = scaled.softmax(-1)  # [sampled, vocab]
        for k, row in enumerate(sampled):
            p = params[row]
            if p.top_k or p.top_p < 1.0:  # top-k / top-p per row, on what min-p left
                probs[k] = top_k_top_p(scaled[k], p).softmax(-1)
        chosen[index] = inverse_cdf(probs, [generators[row] for row in sampled])
    want = [p.logprobs for p in params]
    logprobs: list[float | None] = [None] * len(params)
    tops: list[Top | None] = [None] * len(params)
    if any(want):
        every = (logits if raw is None else raw.float()).log_softmax(-1)  # [batch, vocab]
        picked = every.gather(1, chosen[:, None])[:, 0].tolist()  # [batch]
        logprobs = [lp if w else None for lp, w in zip(picked, want, strict=True)]
        k = max((p.top_logprobs for p in params if not p.logprob_token_ids), default=0)
        if k:
            values, ids = every.topk(min(k, every.shape[-1]), dim=-1)  # [batch, k], most likely first
            values, ids = values.tolist(), ids.tolist()
            tops = [(tuple(ids[r][:p.top_logprobs]), tuple(values[r][:p.top_logprobs]))
                    if p.top_logprobs and not p.logprob_token_ids else None for r, p in enumerate(params)]
        for r, p in enumerate(params):  # logprob_token_ids: exactly the listed tokens' logprobs, in their order
            if p.logprob_token_ids:
                listed = torch.tensor(p.logprob_token_ids, device=every.device)
                tops[r] = (p.logprob_token_ids, tuple(every[r, listed].tolist()))
    return chosen.tolist(), logprobs, tops


class Sampler:
    """One step's sampling over its rows: the grammars' masks first (vLLM's order: the penalties and the logprobs see
    the masked distribution), then the penalties and masks (engine/logits_controls.py), then `sample`, each row with
    its own generator; the chosen tokens then go into the controls and the grammars. A sequence's state is made when
    its prompt is in (`start`) and lives on its record. Engine thread only."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.controls = LogitsControls(device)  # penalties and masks: per-sequence rows, batched apply
        self.masks = GrammarMasks()  # structured outputs: the constrained rows' batched mask

    def start(self, seqs: list[Sequence], req: EngineRequest) -> None:
        """`seqs` (a request's choices) decode from now on the prompt of `req`: each gets its generator, its controls
        and its grammar's matcher."""
        if any(s.sampling.repetition_penalty != 1.0 for s in seqs) and req.embed_spans:  # supplied rows are no tokens
            covered = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
            prompt_ids = [t for i, t in enumerate(req.token_ids) if i not in covered]
        else:
            prompt_ids = req.token_ids
        for seq in seqs:
            seq.generator = make_generator(seq.sampling.seed, self.device)
            self.controls.start(seq, prompt_ids)
            if seq.grammar is not None:  # each choice follows the grammar with its own matcher
                self.masks.start(seq)

    def release(self, seq: Sequence) -> None:
        self.controls.release(seq)
        seq.generator = seq.matcher = None

    def step(self, rows: list[Sequence], done: list[tuple[int, Sequence]],
             logits: torch.Tensor | None) -> tuple[StepOutput, list[Top | None]]:
        """A step's logits [rows + completed prompts, vocab] -> a token for each decoding row (logits row i is
        rows[i]'s) and each prompt in `done` ((its logits row after the rows', it)) and its other choices, which take
        their first token from its row; with each one's logprob and top logprobs."""
        seqs, index = list(rows), list(range(len(rows)))
        for row, seq in done:
            seqs += [seq, *seq.forks]
            index += [len(rows) + row] * (1 + len(seq.forks))
        if not seqs:
            return StepOutput([], [], [], [], set()), []
        if index != list(range(logits.shape[0])):  # choices, or rows of failed prompts
            logits = logits[torch.tensor(index, device=logits.device)]
        logits = self.masks.apply(logits, seqs)  # `logits` itself when no row has a grammar
        controlled = self.controls.apply(logits, seqs)  # [rows, vocab]; `logits` itself when no row has a control
        tokens, logprobs, tops = sample(controlled, [s.sampling for s in seqs], [s.generator for s in seqs], raw=logits)
        self.controls.record(seqs, tokens)
        stops = self.masks.advance(seqs, tokens)
        return StepOutput([s for _, s in done], seqs, tokens, logprobs, stops), tops
