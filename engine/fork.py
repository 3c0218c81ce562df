"""n > 1 choices from one prompt (OpenAI's and vLLM's `n`): the prompt is prefilled once, then its row is forked.

A request of n choices is one Sequence until its prompt is in; its n - 1 other choices are made beside it
(`choices`), each with its own SamplingParams (`SamplingParams.choice`: seed + index when seeded, vLLM's rule), and
queued nowhere. The scheduler admits the request only where all n fit in --max-running-seqs and holds their slots;
the runner copies the prompt's row into theirs as it joins the batch (ModelRunner._join: key/value columns and any
recurrent state), the engine samples the prefill's last logits once per choice (LLMEngine._sample), each with its own
generator, and the scheduler starts them (Scheduler.update). From then on the choices share nothing: penalties, stop
state, max_tokens and their streams are their own. The caller reads the n streams as one (`merged`), each output tagged
with its choice's index; the first error ends all of them, and leaving it aborts every choice still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from engine.outbox import Listener
from engine.sequence import Sequence
from splice.engine_output import EngineOutput
from splice.engine_request import EngineRequest


def choices(seq: Sequence, req: EngineRequest) -> list[Sequence]:
    """`seq` (choice 0) and, for n > 1, its other choices, which it holds in `forks` until they start."""
    seq.forks = [Sequence(seq.request_id, seq.prompt_len, req.sampling.choice(i), seq.max_model_len,
                          seq.eos_token_ids, index=i, arrival=seq.arrival, grammar=seq.grammar)
                 for i in range(1, req.sampling.n)]
    return [seq, *seq.forks]


async def merged(listeners: list[Listener]) -> AsyncIterator[EngineOutput]:
    """Every choice's outputs as they come (listener i's are choice i's), until each choice has finished; the first
    error (an abort, a failure) ends them all."""
    takes = {asyncio.ensure_future(lst.take()): i for i, lst in enumerate(listeners)}
    try:
        while takes:
            done, _ = await asyncio.wait(takes, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=takes.__getitem__):  # same-time outputs in choice order
                i = takes.pop(task)
                out, error = task.result()
                if out is not None:
                    yield out
                if error is not None:
                    raise error
                if out is None or not out.finished:
                    takes[asyncio.ensure_future(listeners[i].take())] = i
    finally:
        for task in takes:
            task.cancel()
        await asyncio.gather(*takes, return_exceptions=True)
