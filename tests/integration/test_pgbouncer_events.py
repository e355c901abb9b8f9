"""Live events behind PgBouncer in transaction pooling mode (a real one): ``LISTEN`` is
session state the pooler does not keep, so a follower listens on ``DIRECT_DATABASE``, or
polls through the pooler without one. Either way it sees every record, in order, once."""

from __future__ import annotations

import time

import pytest

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo
from durable_agents.models import Follower
from tests.support import procs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.pgbouncer]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["direct", "expiry"])
def test_a_follower_behind_pgbouncer_sees_every_record(pgbouncer, mode):
    run_id = f"pgb-events-{mode}"
    store = DjangoStore()
    store.create_run(RunInfo(run_id=run_id, agent="echo", status=RUNNING))
    # A keep-alive far away: whatever arrives, arrives by a notification or a poll.
    child = procs.start(
        ["tests.support.follow_child", run_id, "60"], **pgbouncer.env(direct=mode == "direct")
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline().strip()
        assert first == RUNNING, (first, child.stderr.read() if child.poll() is not None else "")
        # Registered for notifications only when it listens (on the direct connection).
        assert Follower.objects.filter(run_id=run_id).exists() == (mode == "direct")
        seqs, waited = [], []
        for name in ("step:a", "step:b", "step:c"):
            began = time.monotonic()
            entry, _ = store.insert(run_id, name, "{}")
            assert child.stdout.readline().strip() == str(entry.seq)
            waited.append(time.monotonic() - began)
            seqs.append(entry.seq)
        store.update_run(run_id, {"status": FINISHED})
        assert child.stdout.readline().strip() == FINISHED
        child.wait(timeout=30)
        assert child.returncode == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)
    assert seqs == sorted(seqs) and max(waited) < 5, waited
    assert not Follower.objects.filter(run_id=run_id).exists()
