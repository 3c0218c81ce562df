"""Issue 40's soak, short (bench/hostile_soak.py runs the long one with figures): normal streaming clients over HTTP
(chat, completions, a picture) on a vision model beside one round of the cheaper hostile inputs, readers that never
read among them: every normal request streams to its end, every hostile one is answered 200 or 400 (never a 5xx),
the silent readers are paused on the engine, and both services are alive after it."""

from __future__ import annotations

import asyncio

from app.launch import start_stack
from tests.harness.hostile_soak import Run, hostile_loop, normal_clients

INPUTS = ["deep_tool", "deep_arguments", "deep_spec", "many_choices", "wont_hold", "salted_pictures",
          "silent_readers", "prompt_logprobs"]


def test_normal_clients_are_served_beside_a_round_of_hostile_inputs(tiny_dirs):
    engine, pre = start_stack("tiny-qwen2-vl", http_port=0, engine_args=[
        "--metrics-port", "0", "--max-running-seqs", "48", "--max-seqs-per-request", "8"])
    try:
        run = Run()
        finished: list[bool] = []

        async def soak() -> None:
            async def hostile() -> None:
                await hostile_loop(engine, pre.http_address, lambda: False, run, INPUTS, readers=2, choices=4,
                                   many=16, silent_wait=300.0, rounds=1)
                finished.append(True)

            await asyncio.gather(normal_clients(f"http://{pre.http_address}", 6, lambda: bool(finished), run),
                                 hostile())

        asyncio.run(soak())
        assert not run.errors, run.summary()
        assert sum(run.requests.values()) > 0
        assert set(run.hostile) == set(INPUTS), run.summary()
        assert all(s in (200, 400) for name, statuses in run.hostile.items() if name != "silent_readers"
                   for s in statuses), run.summary()
        assert run.hostile["silent_readers"] == {"paused": 1}, run.summary()
        assert engine.alive and pre.alive
    finally:
        pre.stop()
        engine.stop()
