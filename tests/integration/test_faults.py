"""Short versions of bench/faults.py's scenarios that no other test covers, asserting their outcomes (the
figures are the script's): a killed preprocessor is restarted by `splice up` and serves again; hostile requests
running beside normal traffic are each refused with a defined status while the normal traffic has no errors.
(Engine kill -9 under splice up: test_supervise.py; SIGSTOP: test_failures.py.)"""

from __future__ import annotations

import asyncio

import pytest

from tests.harness import faults


@pytest.fixture(scope="module")
def up(tiny_dirs):
    up = faults.start_up()
    yield up
    up.stop()
    up.kill()


def test_killed_preprocessor_is_restarted_and_serves(up):
    outcome = asyncio.run(faults.preprocessor(up, 4))
    print(outcome.report())
    assert not outcome.problems, outcome.report()


def test_hostile_traffic_beside_normal_traffic(up):
    outcome = asyncio.run(faults.hostile(up, workers=4, seconds=8))
    print(outcome.report())
    assert not outcome.problems, outcome.report()
