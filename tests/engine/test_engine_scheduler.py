"""Scheduler and Sequence driven by hand from factories: no model, no torch in the code under test."""

from __future__ import annotations

import sys

import pytest

from engine.scheduler import Scheduler, SchedulerOutput, StepOutput
from engine.sequence import SeqStatus, Sequence
from splice.engine_output import FinishReason
from splice.errors import InvalidArgument, ResourceExhausted
from splice.sampling import SamplingParams


def seq(prompt_len: int = 4, rid: str = "r", max_model_len: int = 64, eos=(3,), **sampling) -> Sequence:
    return Sequence(rid, prompt_len, SamplingParams(**sampling), max_model_len, eos)


def ran(s: Scheduler, out: SchedulerOutput, token: int = 5) -> list[Sequence]:
    """What the engine tells the scheduler after `out` ran: every prompt part went through, and every decoding row,
    completed prompt and started choice took `token`."""
    done = [p.seq for p in out.prefill if p.end == p.seq.prompt_len]
    rows = [*out.decode, *(x for d in done for x in (d, *d.forks))]
    return s.update(out, StepOutput(done, rows, [token] * len(rows), [None] * len(rows), set()))


def step(s: Scheduler) -> SchedulerOutput:
    """One step: schedule, run."""
    out = s.schedule()
    ran(s, out)
    return out


def admitted(out: SchedulerOutput) -> list[Sequence]:
    return [p.seq for p in out.prefill]


def test_scheduler_module_does_not_import_torch():
    import subprocess

    code = "import sys, engine.scheduler, engine.sequence; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_new_sequences_prefill_then_everyone_decodes_together():
    s = Scheduler(max_running_seqs=4, max_batch_tokens=100, max_queue=10)
    a, b = seq(5), seq(7)
    s.add(a)
    s.add(b)
    out = step(s)
    assert admitted(out) == [a, b] and not out.decode
    assert [(p.start, p.end) for p in out.prefill] == [(0, 5), (0, 7)]
    assert a.status is b.status is SeqStatus.RUNNING
    assert step(s).decode == [a, b]
    c = seq(3)
    s.add(c)  # joins at the next boundary without waiting for a and b
    assert admitted(step(s)) == [c]
    assert step(s).decode == [a, b, c]
    assert a.output_ids == [5, 5, 5, 5] and c.output_ids == [5, 5] and c.computed == 4


def test_running_limit_keeps_the_rest_waiting_until_one_leaves():
    s = Scheduler(max_running_seqs=2, max_batch_tokens=100, max_queue=10)
    seqs = [seq(4, f"r{i}") for i in range(3)]
    for x in seqs:
        s.add(x)
    assert admitted(step(s)) == seqs[:2]
    assert step(s).decode == seqs[:2] and seqs[2].status is SeqStatus.WAITING
    s.finish(seqs[0], FinishReason.STOP)
    assert seqs[0].is_finished and seqs[0].finish_reason is FinishReason.STOP
    assert admitted(step(s)) == [seqs[2]]
    assert step(s).decode == [seqs[1], seqs[2]]


def test_prefill_budget_counts_padded_positions():
    s = Scheduler(max_running_seqs=8, max_batch_tokens=20, max_queue=10)
    a, b, c = seq(8), seq(10), seq(2)
    for x in (a, b, c):
        s.add(x)
    # a + b padded to 10 each = 20 fits; adding c makes 3 x 10 = 30
    assert admitted(step(s)) == [a, b]
    assert admitted(step(s)) == [c]


def test_prompt_longer_than_the_batch_budget_is_rejected():
    s = Scheduler(max_running_seqs=2, max_batch_tokens=16, max_queue=1)
    with pytest.raises(InvalidArgument, match="at most 16"):
        s.add(seq(17))


def test_queue_full_is_resource_exhausted():
    s = Scheduler(max_running_seqs=2, max_batch_tokens=100, max_queue=1)
    for i in range(3):
        s.add(seq(4, f"r{i}"))
    with pytest.raises(ResourceExhausted, match="queue is full"):
        s.add(seq(4, "late"))
    step(s)
    with pytest.raises(ResourceExhausted):  # 2 running + 1 waiting: still full
        s.add(seq(4, "late"))
    s.finish(s.running[0], FinishReason.LENGTH)
    s.add(seq(4, "late"))


def test_aborts_are_drained_from_running_and_waiting():
    s = Scheduler(max_running_seqs=1, max_batch_tokens=100, max_queue=5)
    a, b = seq(4, "a"), seq(4, "b")
    s.add(a)
    s.add(b)
    step(s)
    a.abort_requested = b.abort_requested = True
    assert s.drain_aborts() == [a, b]
    assert a.finish_reason is b.finish_reason is FinishReason.ABORT
    assert not s.has_work and s.schedule().is_empty


def test_sequence_stops_on_eos_stop_ids_and_length():
    x = seq(4, max_tokens=3)
    assert x.append(10) is None and x.append(11) is None
    assert x.append(12) is FinishReason.LENGTH
    assert seq(4).append(3) is FinishReason.STOP  # the model's EOS
    assert seq(4, ignore_eos=True).append(3) is None
    assert seq(4, stop_token_ids=(9,)).append(9) is FinishReason.STOP
    full = seq(60, max_model_len=62)  # room for 2 only, whatever max_tokens says
    assert full.max_new_tokens == 2 and full.append(5) is None and full.append(5) is FinishReason.LENGTH
    lp = seq(4, logprobs=True)
    lp.append(7, -1.5)
    assert lp.logprobs == [-1.5] and lp.total_len == 5


def test_while_sequences_run_each_step_decodes_them_and_admits_a_bounded_prefill():
    s = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=10, mixed_prefill_tokens=12)
    a = seq(4)
    s.add(a)
    assert admitted(step(s)) == [a]
    arrivals = [seq(5, f"n{i}") for i in range(3)] + [seq(30, "long")]
    for x in arrivals:
        s.add(x)
    out = step(s)
    assert out.decode == [a] and admitted(out) == arrivals[:2]  # 2 x 5 padded positions fit in 12, 3 x 5 do not
    out = step(s)
    assert out.decode == [a, *arrivals[:2]] and admitted(out) == [arrivals[2]]
    long = arrivals[3]
    out = step(s)  # longer than the budget: admitted alone, prefilled 12 positions per step
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(long, 0, 12)]
    assert len(out.decode) == 4 and long.status is SeqStatus.RUNNING and s.prefilling is long
    assert long.computed == 12 and not long.output_ids
    s.add(late := seq(2, "late"))
    s.add(later := seq(7, "later"))
    out = step(s)  # a short prompt passes it (within half the step), then its next part takes the rest
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(late, 0, 2), (long, 12, 22)]
    assert len(out.decode) == 4 and late.output_ids == [5]
    out = step(s)  # 7 positions are more than half a step: "later" waits for the long prompt
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(long, 22, 30)] and len(out.decode) == 5
    assert s.prefilling is None and long.computed == 30 and long.output_ids == [5]  # (from its last part)
    out = step(s)
    assert admitted(out) == [later] and long in out.decode


def test_a_long_prompt_asking_for_prompt_logprobs_goes_in_parts_even_on_an_idle_engine():
    s = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=10, mixed_prefill_tokens=12)
    s.add(scored := seq(30, "scored", prompt_logprobs=5))
    s.add(seq(30, "plain"))
    out = step(s)  # nothing decodes, yet its positions go 12 at a time (the plain one waits behind it)
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(scored, 0, 12)]
    s.add(short := seq(3, "short"))
    out = step(s)
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(short, 0, 3), (scored, 12, 21)]
    out = step(s)
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(scored, 21, 30)]
    s2 = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=10, mixed_prefill_tokens=12)
    s2.add(plain2 := seq(30, "plain"))
    s2.add(seq(30, "scored", prompt_logprobs=5))
    assert admitted(step(s2)) == [plain2]  # an unscored one on an idle engine: at once, alone


def test_a_packed_mixed_step_admits_by_the_prompts_own_lengths():
    """Packed into one forward, admitted prompts are not padded: 5 + 2 + 3 positions fit a budget of 12 where
    padded (3 x 5) they do not; the padded size still stays within max_batch_tokens (the two-forward fallback)."""
    for packs, want in ((False, 2), (True, 3)):
        s = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=10, mixed_prefill_tokens=12,
                      packs_mixed_steps=packs)
        s.add(a := seq(4))
        step(s)
        arrivals = [seq(n, f"n{k}") for k, n in enumerate((5, 2, 3, 3))]
        for x in arrivals:
            s.add(x)
        out = step(s)
        assert out.decode == [a] and admitted(out) == arrivals[:want], packs
    s = Scheduler(max_running_seqs=8, max_batch_tokens=12, max_queue=10, mixed_prefill_tokens=12,
                  packs_mixed_steps=True)
    s.add(a := seq(2))
    step(s)
    arrivals = [seq(n, f"m{n}") for n in (6, 1, 1)]
    for x in arrivals:
        s.add(x)
    assert admitted(step(s)) == arrivals[:2]  # 6 + 1 + 1 fits 12, but padded 3 x 6 = 18 > max_batch_tokens
    s2 = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=10, packs_mixed_steps=True)
    s2.add(b := seq(5))
    s2.add(c := seq(3, "c"))
    assert admitted(step(s2)) == [b, c]  # nothing running: a prefill forward, padded 2 x 5 within 100


def _with_choices(parent: Sequence, n: int) -> Sequence:
    parent.forks = [Sequence(parent.request_id, parent.prompt_len, parent.sampling, parent.max_model_len, index=i)
                    for i in range(1, n)]
    return parent


def test_a_request_of_n_choices_is_admitted_only_where_all_n_fit_and_its_slots_stay_reserved():
    s = Scheduler(max_running_seqs=4, max_batch_tokens=100, max_queue=10)
    a = _with_choices(seq(4, "a"), 3)
    b = _with_choices(seq(4, "b"), 2)
    s.add(a)
    s.add(b)
    children = list(a.forks)
    out = s.schedule()
    assert admitted(out) == [a]  # b's two choices do not fit beside a's three
    assert s.reserved == 2 and s.used == 3
    ran(s, out)  # a's prompt is in: its other choices run beside it, in the reserved slots, each with its token
    assert [c.index for c in children] == [1, 2] and all(c.status is SeqStatus.RUNNING for c in children)
    assert s.running == [a, *children] and s.reserved == 0 and not a.forks
    assert all(c.output_ids == [5] and c.computed == 4 for c in (a, *children))
    assert step(s).decode == [a, *children] and b.status is SeqStatus.WAITING
    s.finish(children[0], FinishReason.STOP)
    s.finish(a, FinishReason.STOP)
    assert admitted(step(s)) == [b] and s.used == 3  # two slots freed: b and its reserved choice


def test_a_request_that_ends_before_its_choices_start_frees_their_slots():
    s = Scheduler(max_running_seqs=3, max_batch_tokens=100, max_queue=10)
    a = _with_choices(seq(4, "a"), 3)
    s.add(a)
    s.schedule()  # (aborted before it ran)
    assert s.used == 3
    a.abort_requested = True
    assert s.drain_aborts() == [a]
    assert s.used == 0 and not a.forks and not s.running


def test_n_beyond_the_running_slots_is_refused_naming_n():
    s = Scheduler(max_running_seqs=4, max_batch_tokens=100, max_queue=10)
    with pytest.raises(InvalidArgument, match=r"n is 5.*--max-running-seqs"):
        s.add(_with_choices(seq(4), 5))
    assert not s.waiting


def test_update_ends_rows_on_stop_ids_length_and_complete_grammars_and_returns_them():
    s = Scheduler(max_running_seqs=4, max_batch_tokens=100, max_queue=10)
    stop, length, grammar, going = seq(4, "stop"), seq(4, "length", max_tokens=1), seq(4, "grammar"), seq(4, "on")
    for x in (stop, length, grammar, going):
        s.add(x)
    out = s.schedule()
    rows = [stop, length, grammar, going]
    ended = s.update(out, StepOutput(rows, rows, [3, 7, 7, 7], [None, -0.5, None, None], {2}))  # 3: the EOS
    assert ended == [stop, length, grammar] and s.running == [going]
    assert [x.finish_reason for x in ended] == [FinishReason.STOP, FinishReason.LENGTH, FinishReason.STOP]
    assert length.logprobs == [-0.5] and going.output_ids == [7] and going.computed == 4
    assert step(s).decode == [going] and going.computed == 5


def test_max_loras_bounds_the_adapters_running_together():
    """A waiting sequence whose adapter would be one adapter too many waits; those behind it that fit (the base, a
    running adapter) are admitted before it; it is admitted once an adapter's sequences have left."""
    a, b, c = "adapter-a", "adapter-b", "adapter-c"  # (any hashable stands for an adapter: the scheduler only counts)
    s = Scheduler(max_running_seqs=8, max_batch_tokens=64, max_queue=8, max_loras=2)
    seqs = [seq(rid=r, max_tokens=m) for r, m in (("a", 2), ("b", 9), ("c", 9), ("base", 9), ("a2", 9))]
    for x, adapter in zip(seqs, (a, b, c, None, a), strict=True):
        x.adapter = adapter
        s.add(x)
    first = admitted(step(s))
    assert [x.request_id for x in first] == ["a", "b", "base", "a2"]  # c waits: a and b run
    assert {x.adapter for x in s.running if x.adapter} == {a, b}
    while any(x.request_id in ("a", "a2") for x in s.running):
        assert not admitted(step(s))
    assert [x.request_id for x in admitted(step(s))] == ["c"]
    assert len({x.adapter for x in s.running if x.adapter}) <= 2


def test_short_prompts_passing_a_long_partial_prefill_keep_to_max_loras():
    """While a long prompt goes in parts, a short one whose adapter would be one too many does not pass it; one under
    a running adapter does."""
    a, b = "adapter-a", "adapter-b"
    s = Scheduler(max_running_seqs=8, max_batch_tokens=100, max_queue=8, mixed_prefill_tokens=12, max_loras=1)
    s.add(first := seq(4, "first"))
    first.adapter = a
    step(s)
    s.add(long := seq(30, "long"))
    long.adapter = a
    assert [(p.seq, p.start, p.end) for p in step(s).prefill] == [(long, 0, 12)]
    s.add(other := seq(2, "other"))
    other.adapter = b
    s.add(same := seq(2, "same"))
    same.adapter = a
    out = step(s)
    assert [(p.seq, p.start, p.end) for p in out.prefill] == [(same, 0, 2), (long, 12, 22)]
    assert other.status is SeqStatus.WAITING
