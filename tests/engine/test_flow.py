"""Readers that fall behind (engine/flow.py, issue 40 row 9): a request whose reader is --max-unread-tokens behind is
left out of the decode, keeping its slot, until it reads; others run beside it meanwhile; one paused past
--unread-timeout is cancelled. The scheduler from factories (no torch), then the engine on tiny models: the rows that
decode while another waits, and the paused one once it reads again, give the tokens of their solo runs."""

from __future__ import annotations

import pytest

from engine.flow import Flow
from engine.scheduler import Scheduler, StepOutput
from engine.sequence import Sequence
from splice.errors import DeadlineExceeded
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, random_ids, text_request, wait_until

LIMIT = 6  # --max-unread-tokens of the engines below


def _seq(flow: Flow | None = None) -> Sequence:
    s = Sequence("r", 4, SamplingParams(), 64)
    s.flow = flow
    return s


def test_a_request_behind_its_reader_is_not_decoded_and_keeps_its_slot_until_it_reads():
    sched = Scheduler(max_running_seqs=3, max_batch_tokens=100, max_queue=10)
    flow = Flow(limit=4)
    slow, quick = _seq(flow), _seq(Flow(limit=4))
    for s in (slow, quick):
        sched.add(s)
    out = sched.schedule()
    sched.update(out, StepOutput([slow, quick], [slow, quick], [5, 5], [None, None], set()))
    flow.sent = 4  # four tokens sent, none read
    out = sched.schedule()
    assert out.decode == [quick] and out.paused == [slow]
    assert sched.used == 2  # its slot stays taken
    waiting = _seq()
    sched.add(waiting)
    assert [p.seq for p in sched.schedule().prefill] == [waiting]
    flow.add_read(1)  # it reads: decoded again at the next schedule
    assert slow in sched.schedule().decode


def test_a_reader_catching_up_wakes_the_engine():
    woken = []
    flow = Flow(limit=3, wake=lambda: woken.append(True))
    flow.sent = 5
    flow.add_read(1)  # still behind
    assert flow.behind and not woken
    flow.add_read(2)
    assert not flow.behind and woken == [True]
    assert not Flow(limit=0, sent=10**6).behind  # 0: never paused


def _record(engine, request_id: str) -> Sequence:
    return next(s for s in engine.requests.values() if s.request_id == request_id)


@pytest.mark.parametrize("name", ["tiny-text", "tiny-gemma3", "tiny-qwen3.5"])
async def test_a_paused_request_costs_no_steps_and_resumes_with_its_solo_tokens(engines, name):
    """tiny-text packs mixed steps (the paused row waits after the rows of a packed forward), gemma3 decodes with
    transformers' modules, qwen3.5 keeps recurrent states beside the slots (the paused row's state is set aside)."""
    engine = engines(name, max_unread_tokens=LIMIT)
    slow_ids, other_ids = random_ids(9, seed=11), random_ids(6, seed=12)
    want_slow, _ = await collect(engine, text_request(slow_ids, max_tokens=24))
    want_other, _ = await collect(engine, text_request(other_ids, max_tokens=16))
    stream = engine.generate(text_request(slow_ids, "slow", max_tokens=24))
    first = await anext(stream)  # then it reads nothing
    await wait_until(lambda: engine.scheduler.running and all(s.paused for s in engine.scheduler.running),
                     "the reader fell behind")
    slow = _record(engine, "slow")
    paused_at = slow.num_generated
    assert paused_at <= len(first.token_ids) + LIMIT
    got_other, _ = await collect(engine, text_request(other_ids, "other", max_tokens=16))
    assert got_other == want_other  # decoded beside a paused row (moved to the slots after it)
    assert slow.num_generated == paused_at  # no token made for a reader that does not read
    rest = [t async for out in stream for t in out.token_ids]
    assert list(first.token_ids) + rest == want_slow


async def test_the_choices_of_a_paused_request_resume_with_their_solo_tokens(engines):
    engine = engines("tiny-text", max_unread_tokens=LIMIT)
    ids = random_ids(7, seed=13)
    want, _ = await collect(engine, text_request(ids, max_tokens=12, n=3, temperature=0.8, seed=5))
    stream = engine.generate(text_request(ids, "three", max_tokens=12, n=3, temperature=0.8, seed=5))
    outs = [await anext(stream)]
    await wait_until(lambda: len(engine.scheduler.running) == 3 and all(s.paused for s in engine.scheduler.running),
                     "the three choices paused")
    got_other, _ = await collect(engine, text_request(random_ids(5, seed=14), "other", max_tokens=8))
    assert len(got_other) == 8
    outs += [out async for out in stream]
    assert sorted(t for o in outs for t in o.token_ids) == sorted(want)
    by_choice = {i: [t for o in outs if o.index == i for t in o.token_ids] for i in range(3)}
    assert all(len(tokens) == 12 for tokens in by_choice.values())


async def test_a_request_paused_past_the_unread_timeout_is_cancelled_and_frees_its_slot(engines):
    engine = engines("tiny-text", max_unread_tokens=LIMIT, unread_timeout=0.2)
    stream = engine.generate(text_request(random_ids(5, seed=15), "dead", max_tokens=500))
    await anext(stream)
    await wait_until(lambda: not engine.requests, "the dead reader's request cancelled")
    with pytest.raises(DeadlineExceeded, match="--max-unread-tokens"):
        async for _ in stream:
            pass
    got, _ = await collect(engine, text_request(random_ids(5, seed=16), "next", max_tokens=4))
    assert len(got) == 4
