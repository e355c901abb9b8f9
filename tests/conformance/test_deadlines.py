"""Approval deadlines on every store (InMemoryStore, PostgreSQL, SQLite): ``due_at`` stamped
on the store's clock when a request is saved and moved after each step, the one indexed read
of the requests due, and each step (remind, escalate, expire) taken once by the timer sweep.

The database's clock cannot be moved, so the deadlines here are short (fractions of a
second) and the tests poll, with a deadline, until a step is due."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import durable_agents as da
from durable_agents.engine import names
from durable_agents.engine.commands.runs import drive_quietly
from durable_agents.engine.commands.timers import wake_timers
from durable_agents.engine.journal import Journal
from durable_agents.engine.ports import ApprovalRequestInfo, DecisionInfo
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support import wiring

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


# -- the steps, driven by the sweep --------------------------------------------------------


@pytest.fixture
def wired(store):
    with wiring.wired(
        dispatcher=lambda run_id: drive_quietly(run_id, store=store),
        halt_min_age=lambda: 0.0,
        eligible_approvers=lambda group: {"finance": ["ann"], "oncall": ["olga"]}.get(group, []),
    ):
        yield store


FIRED: list[int] = []


@da.tool(
    approval=da.Quorum(1, "finance"),
    deadline=da.Deadline(remind=0.3, escalate=(1.5, "oncall"), expire=3.0),
)
def pay(cents: int) -> str:
    """Pay out."""
    FIRED.append(cents)
    return "paid"


@da.tool(
    name="pay",
    approval=da.Quorum(1, "finance"),
    deadline=da.Deadline(escalate=(0.2, "oncall"), expire=600),
)
def pay_slowly(cents: int) -> str:
    """Pay out."""
    FIRED.append(cents)
    return "paid"


def _agent(tool: Any) -> da.Agent:
    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("ok")]
    return da.Agent("deadlines-pay", ScriptedModel(script), "", [tool])


def _asked(store, run_id: str, tool: Any = pay) -> str:
    with pytest.raises(da.ApprovalPending):
        _agent(tool).run(run_id, "pay", store=store)
    [request] = store.list_approval_requests(run_id=run_id)
    return request.call_id


def test_each_step_is_taken_once_and_the_expiry_tells_the_model(wired):
    store = wired
    FIRED.clear()
    call = _asked(store, "d1")
    journal = Journal(store)

    def step(name: str) -> Any:
        wake_timers(store=store)
        return journal.get("d1", names.deadline(call, name))

    remind = until(lambda: step("remind"))
    assert remind.get("step") == "remind"
    escalate = until(lambda: step("escalate"))
    assert escalate.get("escalated_to") == "oncall"
    assert store.get_approval_request("d1", call).policy["escalated_to"] == "oncall"
    until(lambda: step("expire"))
    run = store.get_run("d1")
    assert run.status == "finished" and FIRED == []
    request = store.get_approval_request("d1", call)
    assert request.status == "expired" and request.decided_at is not None
    assert request.due_at is None
    assert journal.get("d1", names.tool(call)).get("result")["error"] == "expired"
    names_written = [r.name for r in journal.records("d1")]
    for step_name in ("remind", "escalate", "expire"):
        assert names_written.count(names.deadline(call, step_name)) == 1
    with pytest.raises(da.ApprovalExpired):
        da.approve("d1", call, True, by="ann", store=store)


def test_an_escalated_request_may_be_decided_by_the_escalation_group(wired):
    store = wired
    FIRED.clear()
    call = _asked(store, "d2", pay_slowly)
    with pytest.raises(da.ApproverNotEligible):
        da.approve("d2", call, True, by="olga", store=store)

    def escalated() -> bool:
        wake_timers(store=store)
        return "escalated_to" in store.get_approval_request("d2", call).policy

    until(escalated)
    assert da.approve("d2", call, True, by="olga", store=store).status == "approved"
    assert FIRED == [5] and store.get_run("d2").status == "finished"
    assert store.get_approval_request("d2", call).due_at is None
