"""Approval deadlines survive SIGKILL (issue 42), on PostgreSQL with real processes: a sweep
killed inside a deadline step — after its record, after the expiry's denial, after the
request expired and before its run was handed over or cancelled — is finished by the next
sweep, in another process, exactly once. Counted outside the journal: the refund's effects
(``test_effects``: never, nobody approved it) and what a real webhook receiver on 127.0.0.1
is told (each step once, though the process that made it died before telling anyone: the
notification outbox's reconciling pass tells it from the step's record)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db.models import F

import durable_agents as da
from durable_agents.models import ActionLog, ApprovalRequest, Halt, JournalEntry, Run
from durable_agents.notifications import deliver
from tests.support.agents import count_effects
from tests.support.people import make_user
from tests.support.procs import run_json
from tests.support.receiver import Receiver, verified
from tests.support.rule_agents import FINANCE, LEADS, deadlines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(180)]

CALL = "call_1_1"
HOUR = 3600


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    """A webhook receiver, and the parent told of it as the children are (tests/settings.py
    reads DA_NOTIFY_URL)."""
    r = Receiver().start()
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {
            "BASE_URL": "https://ops.example.com",
            "CHANNELS": [{"kind": "webhook", "url": r.url, "secret_setting": "NOTIFY_HOOK_SECRET"}],
        },
    }
    make_user("lena", "approve_toolcall", groups=(LEADS,))
    make_user("fay", "approve_toolcall", groups=(FINANCE,))
    yield r
    r.stop()


def _asked(run_id: str, text: str, age: float) -> None:
    with pytest.raises(da.ApprovalPending):
        deadlines.run(run_id, text)
    ago = timedelta(seconds=age)
    ApprovalRequest.objects.filter(run_id=run_id).update(
        created_at=F("created_at") - ago, due_at=F("due_at") - ago
    )


def _sweep(receiver: Receiver, **env: str) -> tuple[int, dict | None]:
    return run_json("tests.support.deadline_child", "sweep", DA_NOTIFY_URL=receiver.url, **env)


def _names(run_id: str) -> list[str]:
    return list(JournalEntry.objects.filter(run_id=run_id).values_list("name", flat=True))


def _told(receiver: Receiver) -> list[tuple[str, str | None]]:
    deliver()
    deliver()
    return [(p["event"], p.get("step")) for p in map(verified, receiver.got)]


@pytest.mark.parametrize(
    ("step", "age", "event"),
    [("remind", 4 * HOUR, "approval_reminded"), ("escalate", 24 * HOUR, "approval_escalated")],
)
def test_a_sweep_killed_after_a_steps_record_is_finished_once(receiver, step, age, event):
    run_id = f"dk-{step}"
    _asked(run_id, "refund 50000", age)
    point = f"after-deadline:{CALL}:{step}"
    assert _sweep(receiver, DURABLE_AGENTS_CRASH_AT=point)[0] == -9
    request = ApprovalRequest.objects.get(run_id=run_id)
    # Journaled, not projected: still due as it was (its first step, 4 h after asking).
    assert f"deadline:{CALL}:{step}" in _names(run_id)
    assert request.due_at - request.created_at == timedelta(hours=4)
    assert "escalated_to" not in request.policy

    assert _sweep(receiver) == (0, {"woken": []})
    assert _sweep(receiver) == (0, {"woken": []})
    request.refresh_from_db()
    after = {"remind": 24 * HOUR, "escalate": 3 * 24 * HOUR}[step]
    assert request.due_at - request.created_at == timedelta(seconds=after)
    assert ("escalated_to" in request.policy) == (step == "escalate")
    assert _names(run_id).count(f"deadline:{CALL}:{step}") == 1
    assert _told(receiver) == [("approval_requested", None), (event, step)]
    assert count_effects(run_id) == {} and request.status == "pending"


@pytest.mark.parametrize(
    "point",
    [f"after-deadline:{CALL}:expire", f"after-expiry-decision:{CALL}", f"after-expiry:{CALL}"],
)
@pytest.mark.parametrize(
    ("order", "on_expiry", "age", "ends"),
    [
        ("refund 50000", "deny", 3 * 24 * HOUR, "finished"),
        ("refund 250000", "halt", 3 * 24 * HOUR, "halted"),
        ("rush 30000", "cancel", HOUR, "cancelled"),
    ],
)
def test_a_sweep_killed_inside_an_expiry_is_finished_once(
    receiver, point, order, on_expiry, age, ends
):
    run_id = f"dk-{on_expiry}-{point.split(':')[0]}"
    _asked(run_id, order, age)
    assert _sweep(receiver, DURABLE_AGENTS_CRASH_AT=point)[0] == -9
    assert Run.objects.get(pk=run_id).status == "awaiting_approval"
    # A person too late is refused (and finishes what the dead sweep left) once the
    # expiry's denial is in; before it, the next sweep takes the step.
    if point != f"after-deadline:{CALL}:expire":
        by = "fay" if on_expiry == "halt" else "lena"
        code, out = run_json("tests.support.deadline_child", "approve", run_id, CALL, by)
        assert (code, out) == (0, {"status": "refused", "code": "approval.expired"})
    assert _sweep(receiver)[0] == 0
    assert _sweep(receiver) == (0, {"woken": []})

    assert Run.objects.get(pk=run_id).status == ends
    assert count_effects(run_id) == {}
    request = ApprovalRequest.objects.get(run_id=run_id)
    assert request.status == "expired" and request.decided_at is not None
    names = _names(run_id)
    assert names.count(f"approval:{CALL}") == 1 and names.count(f"deadline:{CALL}:expire") == 1
    if on_expiry == "halt":
        assert list(Halt.objects.filter(run_id=run_id).values_list("cause", flat=True)) == [
            "expired"
        ]
    if on_expiry == "cancel":
        assert ActionLog.objects.filter(run_id=run_id, action="cancel").count() == 1
        assert names.count("run:cancelled") == 1
    told = _told(receiver)
    assert told.count(("approval_expired", "expire")) == 1
    assert ("approval_decided", None) not in told
