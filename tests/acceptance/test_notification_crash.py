"""Issue 42, at least once without the signal: a process that decides a call is killed
(SIGKILL) after the decision committed and before its notification row was written (the
failpoint ``before-notify:<call>``). The decision stands; the next delivery pass's
reconciling writes the row, and a real receiver on 127.0.0.1 gets the decision once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings

import durable_agents as da
from durable_agents.engine import names
from durable_agents.models import ApprovalRequest, JournalEntry, Notification
from durable_agents.notifications import deliver
from tests.support.agents import gated
from tests.support.people import make_user
from tests.support.procs import run_json
from tests.support.receiver import Receiver, verified

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:
    """A receiver, and the parent told of it as the children are (tests/settings.py reads
    DA_NOTIFY_URL)."""
    r = Receiver().start()
    settings.DURABLE_AGENTS = {
        **django_settings.DURABLE_AGENTS,
        "NOTIFY": {
            "BASE_URL": "https://ops.example.com",
            "CHANNELS": [{"kind": "webhook", "url": r.url, "secret_setting": "NOTIFY_HOOK_SECRET"}],
        },
    }
    make_user("ann", "approve_toolcall", "cancel_run", "resolve_halt")
    yield r
    r.stop()


def _decide_in_child(run_id: str, receiver: Receiver, **env: str) -> int:
    with pytest.raises(da.ApprovalPending):
        gated.run(run_id, "refund order 7")
    call = ApprovalRequest.objects.get(run_id=run_id).call_id
    code, _ = run_json(
        "tests.support.tree_child", "approve", run_id, call, DA_NOTIFY_URL=receiver.url, **env
    )
    return code


def test_a_decider_killed_before_the_notification_row_still_notifies(receiver):
    run_id = "notify-crash"
    call = "call_1_1"
    code = _decide_in_child(run_id, receiver, DURABLE_AGENTS_CRASH_AT=f"before-notify:{call}")
    assert code == -9
    # The fact committed; its row did not.
    assert ApprovalRequest.objects.get(run_id=run_id).status == "approved"
    assert JournalEntry.objects.filter(run_id=run_id, name=names.decision(call)).exists()
    assert not Notification.objects.filter(event="approval_decided").exists()

    done = deliver()
    assert done.reconciled == 1
    assert deliver().reconciled == 0
    events = [verified(g) for g in receiver.got]
    assert [p["event"] for p in events] == ["approval_requested", "approval_decided"]
    assert (events[1]["by"], events[1]["approved"], events[1]["call_id"]) == ("ann", True, call)
    assert Notification.objects.get(event="approval_decided").status == "sent"


def test_a_decider_that_lives_writes_the_row_itself(receiver):
    """The control: the same decision, not killed, leaves the reconciling pass nothing."""
    assert _decide_in_child("notify-alive", receiver) == 0
    assert Notification.objects.filter(event="approval_decided").exists()
    done = deliver()
    assert done.reconciled == 0 and done.sent == 2
