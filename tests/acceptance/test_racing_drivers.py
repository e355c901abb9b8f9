"""Racing drivers: 8 processes drive the same run at once (and 20 runs): 0 double-fires, one
recorded turn per step.

Real PostgreSQL, real processes (``tests.support.race``), released together by a start
barrier. Every tool fire is counted outside the journal (``test_effects``), so a double fire
shows up even if the journal looks clean.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.race import SLOW_AGENT
from tests.support.racing import AGENTS, RACERS, RUNS, check_run, race, total_busy

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("agent", list(AGENTS))
def test_eight_processes_race_one_run(agent):
    run_id = f"race-{uuid.uuid4().hex[:12]}"
    racers = race(agent, [[run_id]] * RACERS)
    check_run(run_id, agent, racers)
    # The racers overlapped: while one drove, the others were turned away by the lease.
    assert total_busy(racers) > 0, racers


@pytest.mark.timeout(180)
def test_eight_processes_race_twenty_runs():
    agent = SLOW_AGENT
    tag = uuid.uuid4().hex[:8]
    run_ids = [f"race-{tag}-{i:02d}" for i in range(RUNS)]
    # Racers 2k and 2k+1 start on the same run and walk the ring in opposite directions,
    # each pair from a different start, so every racer meets others along the way.
    orders = []
    for p in range(RACERS):
        first = (p // 2) * (RUNS // (RACERS // 2))
        ring = run_ids[first:] + run_ids[:first]
        orders.append(ring if p % 2 == 0 else ring[:1] + ring[:0:-1])
    assert all(sorted(o) == run_ids for o in orders)
    racers = race(agent, orders)
    for run_id in run_ids:
        check_run(run_id, agent, racers)
    assert total_busy(racers) > 0, racers
