"""The limits' part of the Store contract (engine.limits), on every store: a slot counts
only while its run's lease is live, claims of one key never over-grant under a race, a rate
grants a burst then says when the next permit frees, and the throttle rows list what waits."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from durable_agents.engine.ports import QUEUED, THROTTLED, RunInfo, ThrottleInfo
from tests.support.procs import in_threads


def _leased(store, n: int, ttl: float = 30.0) -> list[tuple[str, str]]:
    runs = []
    for _ in range(n):
        rid = f"lim-{uuid.uuid4().hex[:12]}"
        store.create_run(RunInfo(run_id=rid, agent="lim"))
        token = f"tok-{uuid.uuid4().hex}"
        assert store.acquire_lease(rid, "w", token, ttl) is not None
        runs.append((rid, token))
    return runs


def test_a_slot_is_granted_up_to_the_limit_and_again_to_its_holder(store):
    key = f"agent/{uuid.uuid4().hex}"
    (a, ta), (b, tb), (c, tc) = _leased(store, 3)
    assert store.claim_slot(key, a, a, ta, 2)
    assert store.claim_slot(key, b, b, tb, 2)
    assert not store.claim_slot(key, c, c, tc, 2)
    assert store.claim_slot(key, a, a, ta, 2), "taking it again is held"
    store.release_slot(key, a, ta)
    assert store.claim_slot(key, c, c, tc, 2)


def test_a_slot_is_given_back_only_under_the_token_it_was_taken_with(store):
    """A driver whose lease lapsed and was taken over gives its slot back at the end of its
    drive: the successor's slot of the same holder (the run, or the same call) stays."""
    key = f"agent/{uuid.uuid4().hex}"
    [(a, stale)] = _leased(store, 1, ttl=0.2)
    [(b, tb)] = _leased(store, 1)
    assert store.claim_slot(key, a, a, stale, 1)
    time.sleep(0.3)
    successor = f"tok-{uuid.uuid4().hex}"
    assert store.acquire_lease(a, "w2", successor, 30.0) is not None
    assert store.claim_slot(key, a, a, successor, 1)
    store.release_slot(key, a, stale)  # the stale driver's drive ends
    assert not store.claim_slot(key, b, b, tb, 1), "the successor still holds the only slot"
    store.release_slot(key, a, successor)
    assert store.claim_slot(key, b, b, tb, 1)


def test_a_slot_frees_with_its_lease(store):
    key = f"tool/{uuid.uuid4().hex}"
    (a, ta), (b, tb) = _leased(store, 2)
    assert store.claim_slot(key, a, a, ta, 1)
    assert not store.claim_slot(key, b, b, tb, 1)
    store.release_lease(a, ta)  # its driver let the run go (or died and its lease expired)
    assert store.claim_slot(key, b, b, tb, 1)


def test_a_slot_frees_when_its_lease_expires(store):
    key = f"tool/{uuid.uuid4().hex}"
    [(a, ta)] = _leased(store, 1, ttl=0.2)
    [(b, tb)] = _leased(store, 1)
    assert store.claim_slot(key, f"{a}#c1", a, ta, 1)
    assert not store.claim_slot(key, f"{b}#c1", b, tb, 1)
    time.sleep(0.3)
    assert store.claim_slot(key, f"{b}#c1", b, tb, 1)


def test_no_slot_without_the_lease(store):
    key = f"agent/{uuid.uuid4().hex}"
    [(a, _token)] = _leased(store, 1)
    assert not store.claim_slot(key, a, a, "not-the-token", 5)


def test_racing_claims_never_over_grant(store):
    key = f"agent/{uuid.uuid4().hex}"
    runs = _leased(store, 12)
    granted = in_threads(12, lambda i: store.claim_slot(key, runs[i][0], *runs[i], 3))
    assert sum(granted) == 3


def test_a_rate_grants_its_burst_then_says_when(store):
    key = f"tool/{uuid.uuid4().hex}"
    assert [store.take_permit(key, 3, 60.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = store.take_permit(key, 3, 60.0)
    assert 19.0 < wait <= 20.0  # one permit frees every 20 s
    assert 19.0 < store.take_permit(key, 3, 60.0) <= 20.0, "a refusal takes nothing"


def test_racing_permits_never_over_grant(store):
    key = f"model/{uuid.uuid4().hex}"
    got = in_threads(10, lambda i: store.take_permit(key, 4, 3600.0))
    assert sum(1 for w in got if w == 0.0) == 4


def test_throttled_runs_are_listed_oldest_first_and_by_due(store):
    now = store.now()
    key = f"agent/{uuid.uuid4().hex}"
    ids = []
    for retry, since in [(-5, -30), (600, -60), (-1, -10)]:
        rid = f"lim-{uuid.uuid4().hex[:12]}"
        store.create_run(RunInfo(run_id=rid, agent="lim", status=THROTTLED))
        info = ThrottleInfo(
            rid,
            "lim",
            key,
            "slots",
            "2 at once",
            now + timedelta(seconds=retry),
            now + timedelta(seconds=since),
        )
        assert store.throttle(info) == 1
        ids.append(rid)
    assert [t.run_id for t in store.list_throttled(key=key)] == [ids[1], ids[0], ids[2]]
    due = [t.run_id for t in store.list_throttled(due=True) if t.key == key]
    assert due == [ids[0], ids[2]]
    # Throttled again on the same key about when it retried: the same wait, counted on.
    again = ThrottleInfo(ids[0], "lim", key, "slots", "2 at once", now + timedelta(seconds=9), now)
    assert store.throttle(again) == 2
    [first] = [t for t in store.list_throttled(key=key) if t.run_id == ids[0]]
    assert first.tries == 2 and first.since == now - timedelta(seconds=30)
    # A row beside a run that is no longer throttled means nothing.
    store.update_run(ids[1], {"status": QUEUED})
    assert ids[1] not in [t.run_id for t in store.list_throttled(key=key)]


def test_giving_a_slot_back_says_who_waited_longest(store):
    key = f"agent/{uuid.uuid4().hex}"
    [(a, ta)] = _leased(store, 1)
    assert store.claim_slot(key, a, a, ta, 1)
    assert store.release_slot(key, a, ta) is None  # nobody waits
    now = store.now()
    ids = []
    for since in (-5, -50):
        rid = f"lim-{uuid.uuid4().hex[:12]}"
        store.create_run(RunInfo(run_id=rid, agent="lim", status=THROTTLED))
        info = ThrottleInfo(
            rid, "lim", key, "slots", "1 at once", now, now + timedelta(seconds=since)
        )
        store.throttle(info)
        ids.append(rid)
    assert store.claim_slot(key, a, a, ta, 1)
    assert store.release_slot(key, a, ta) == ids[1]
