"""Approval deadlines on every store (InMemoryStore, PostgreSQL, SQLite): ``due_at`` stamped
on the store's clock when a request is saved and moved after each step, the one indexed read
of the requests due.

The database's clock cannot be moved, so the deadlines here are short (fractions of a
second) and the tests poll, with a deadline, until a step is due."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo
from tests.support.stores import DB

pytestmark = DB

SOON = {"remind": 0.2, "escalate": 0.4, "escalate_to": "oncall", "expire": 0.6}


def _policy(deadline: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {
        "kind": "single",
        **more,
        **({"deadline": {**deadline, "on_expiry": "deny"}} if deadline else {}),
    }


def until(found: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``found()`` until it is truthy (a step falls due by the database's clock)."""
    ends = time.monotonic() + timeout
    while not (got := found()):
        assert time.monotonic() < ends, "nothing came due in time"
        time.sleep(0.02)
    return got


def _seconds(request: ApprovalRequestInfo) -> float | None:
    if request.due_at is None:
        return None
    return round((request.due_at - request.created_at).total_seconds(), 3)


# -- the store -------------------------------------------------------------------------------


def test_a_saved_request_is_due_at_its_first_step_on_the_stores_clock(store, run_id):
    before = store.now()
    store.save_approval_request(
        ApprovalRequestInfo(run_id, "c1", "pay", {"c": 1}, _policy({"escalate": 3600.0}), 1)
    )
    store.save_approval_request(ApprovalRequestInfo(run_id, "c2", "pay", {"c": 2}, _policy(), 1))
    request = store.get_approval_request(run_id, "c1")
    assert request.created_at >= before and _seconds(request) == 3600.0
    assert store.get_approval_request(run_id, "c2").due_at is None
    assert store.list_due_approval_requests() == []


def test_the_requests_due_are_read_soonest_first_and_only_while_pending(store, run_id):
    for call, first in (("late", 0.3), ("early", 0.1), ("never", None), ("gone", 0.05)):
        deadline = {"expire": first} if first else None
        store.save_approval_request(
            ApprovalRequestInfo(run_id, call, "pay", {"c": call}, _policy(deadline), 1)
        )
    assert store.set_approval_status(run_id, "gone", "withdrawn", if_status=["pending"])
    gone = store.get_approval_request(run_id, "gone")
    assert gone.due_at is None and gone.decided_at is not None
    due = until(lambda: len(store.list_due_approval_requests()) == 2)
    assert due
    assert [r.call_id for r in store.list_due_approval_requests()] == ["early", "late"]
    assert [r.call_id for r in store.list_due_approval_requests(limit=1)] == ["early"]


def test_a_deadline_step_moves_the_request_on_and_merges_into_its_policy(store, run_id):
    policy = _policy({"remind": 60.0, "escalate": 120.0, "escalate_to": "oncall"})
    store.save_approval_request(ApprovalRequestInfo(run_id, "c1", "pay", {"c": 1}, policy, 1))
    assert store.advance_deadline(run_id, "c1", next_after=120.0, if_arguments={"c": 1})
    assert _seconds(store.get_approval_request(run_id, "c1")) == 120.0
    # An edit moved it under a stricter rule meanwhile: the escalation keeps the move.
    moved = {**policy, "need": 2, "group": "finance", "moved_by_edit": {"from": "lead"}}
    assert store.update_approval_request(run_id, "c1", policy=moved, if_arguments={"c": 1})
    assert not store.advance_deadline(
        run_id, "c1", next_after=None, merge={"escalated_to": "oncall"}, if_arguments={"c": 2}
    )
    assert store.advance_deadline(
        run_id, "c1", next_after=None, merge={"escalated_to": "oncall"}, if_arguments={"c": 1}
    )
    request = store.get_approval_request(run_id, "c1")
    assert request.policy == {**moved, "escalated_to": "oncall"} and request.due_at is None
    assert store.set_approval_status(run_id, "c1", "expired", if_status=["pending"])
    assert not store.advance_deadline(run_id, "c1", next_after=60.0, if_arguments={"c": 1})
    assert store.get_approval_request(run_id, "c1").due_at is None


def test_a_request_asked_again_is_due_again_from_its_new_asking(store, run_id):
    policy = _policy({"expire": 3600.0})
    first = ApprovalRequestInfo(run_id, "c1", "pay", {"c": 1}, policy, 1)
    store.save_approval_request(first)
    store.save_decision(DecisionInfo(run_id, "c1", "ann", True))
    store.set_approval_status(run_id, "c1", "approved")
    assert store.get_approval_request(run_id, "c1").due_at is None
    again = ApprovalRequestInfo(
        run_id, "c1", "pay", {"c": 1, "memo": ""}, policy, 1, previous_arguments={"c": 1}
    )
    assert store.save_approval_request(again)
    request = store.get_approval_request(run_id, "c1")
    assert request.status == "pending" and request.decided_at is None
    assert _seconds(request) == 3600.0
