"""A cancel reaches a throttled sub-run (issue 41, item 6), on PostgreSQL with real processes.

A tree's sub-run waits for tomorrow: its tool's rate (``1/d``) is spent. Its root is
cancelled, and the cancelling process is SIGKILLed right after the root's ``run:cancelled``
(``after-cancel:<root>``), before it reached the sub-run. A throttled run is a paused one:
the next sweep finishes the cancel there and then, not the sub-run's retry a day later.
Effects are counted outside the journal (``test_effects``)."""

from __future__ import annotations

import time

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.commands.recovery import recover
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import run_json
from tests.support.trust_agents import daily_root

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]


def status(run_id: str) -> str:
    return Run.objects.get(run_id=run_id).status


def test_the_next_sweep_finishes_a_killed_cancel_of_a_tree_whose_sub_run_is_throttled():
    make_user("ann", "cancel_run")
    assert daily_root.run("dg-0", "go").answer == "done"  # today's digest: the rate is spent
    assert count_effects("dg-0/call_1_1") == {"call_1_1": 1}
    leaf = "dg-1/call_1_1"
    with pytest.raises(da.Pause):
        daily_root.run("dg-1", "go")
    assert status(leaf) == "throttled"
    [waiting] = [p for p in da.pending() if p.run_id == leaf]
    assert [w.kind for w in waiting.waits] == ["throttle"]  # until tomorrow
    code, _ = run_json(
        "tests.support.tree_child", "cancel", "dg-1", DURABLE_AGENTS_CRASH_AT="after-cancel:dg-1"
    )
    assert code == -9
    assert (status("dg-1"), status(leaf)) == ("cancelled", "throttled")
    time.sleep(1.1)  # the killed canceller's lease on the root lapses (1 s in its process)
    recover(interval=0)
    assert leaf in wake_timers()
    assert status(leaf) == "cancelled"
    cause = Journal(DjangoStore()).get(leaf, names.RUN_CANCELLED).get("cause")
    assert cause == {"code": "run.ancestor_cancelled", "run_id": "dg-1"}
    assert leaf not in {p.run_id for p in da.pending()}
    assert wake_timers() == []
    assert count_effects(leaf) == {}
