"""The example site's webhook path on PostgreSQL: signature and body checks, concurrent
redeliveries, and a redelivery after the driving process was killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.models import JournalEntry, Run
from example_project import agents
from tests.support.procs import ROOT, in_threads, subprocess_env
from tests.support.webhook_post import post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_effects(settings, tmp_path, monkeypatch):
    """A side-effect ledger of this test's own: other tests drive the example agent too."""
    settings.DEMO_DIR = tmp_path
    monkeypatch.setenv("DA_DEMO_DIR", str(tmp_path))  # for the child processes it starts


def test_bad_signature_or_body_records_nothing():
    assert post("s1", "d-1", "refund order 7", secret="wrong").status_code == 401
    response = post("s1", "d-2", "")
    assert response.status_code == 400 and json.loads(response.content)["code"] == (
        "webhook.bad_body"
    )
    assert not Run.objects.exists() and not JournalEntry.objects.exists()


def test_ten_concurrent_deliveries_open_one_turn():
    responses = in_threads(10, lambda i: post("s-conc", "d-1", "My order 7 is late."))
    assert {r.status_code for r in responses} <= {200, 202}
    runs = {json.loads(r.content)["run_id"] for r in responses}
    assert runs == {"s-conc>event/d-1"}
    turn_runs = Run.objects.filter(session_id="s-conc").exclude(run_id__endswith=">session")
    assert list(turn_runs.values_list("run_id", flat=True)) == ["s-conc>event/d-1"]
    names = [r.name for r in Journal(DjangoStore()).records("s-conc>event/d-1")]
    assert names.count("model:1") == 1 and names.count("model:2") == 1
    assert len(agents.effects("crm")) == 1 and agents.effects("refund") == []
    assert Run.objects.get(run_id="s-conc>event/d-1").status == "awaiting_approval"


def test_same_key_other_message_is_a_conflict():
    assert post("s-409", "d-1", "My order 7 is late.").status_code == 202
    response = post("s-409", "d-1", "Something else")
    assert response.status_code == 409
    assert json.loads(response.content)["code"] == "session.key_conflict"


def test_redelivery_after_the_driver_was_killed_resumes_the_same_turn():
    child = subprocess.run(
        [sys.executable, "-m", "tests.support.webhook_post", "s-crash", "d-9", "Order 7?"],
        cwd=ROOT,
        env=subprocess_env(DURABLE_AGENTS_CRASH_AT="after-model:2", DA_LEASE_TTL="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr
    run_id = "s-crash>event/d-9"
    assert Run.objects.get(run_id=run_id).status == "running"
    deadline = time.monotonic() + 20
    while True:  # redelivered until the dead driver's lease has expired
        response = post("s-crash", "d-9", "Order 7?")
        if Run.objects.get(run_id=run_id).status == "awaiting_approval":
            break
        assert time.monotonic() < deadline, "the turn never resumed"
        time.sleep(0.2)
    assert json.loads(response.content)["run_id"] == run_id
    names = [r.name for r in Journal(DjangoStore()).records(run_id)]
    assert names.count("model:2") == 1, "the recorded turn was replayed, not generated again"
    assert len(agents.effects("crm")) == 1
    turns = Run.objects.filter(session_id="s-crash").exclude(run_id__endswith=">session")
    assert turns.count() == 1
    # Staff approve the refund; the same turn finishes and the redelivery gets its answer.
    from django.contrib.auth.models import Group, User

    import durable_agents as da

    staff = User.objects.create_superuser("staff")
    staff.groups.add(Group.objects.get_or_create(name="support-leads")[0])  # the policy's lead
    da.approve(run_id, "call_2_2", True, by=staff)
    assert Run.objects.get(run_id=run_id).status == "finished"
    final = post("s-crash", "d-9", "Order 7?")
    assert final.status_code == 200 and "refunded order 7" in json.loads(final.content)["answer"]
    assert len(agents.effects("crm")) == 1 and len(agents.effects("refund")) == 1


def test_concurrent_sends_on_one_session_never_mix_turns():
    """Eight senders at once on one session: each message gets its own turn or a clear
    refusal naming the open turn; no turn is answered twice or with another's reply."""
    import durable_agents as da
    from tests.support.agents import echo

    def send(i):
        try:
            return ("ok", echo.session("s-many").send(f"message {i}").run_id)
        except da.ConfigError as exc:
            return ("refused", exc.code)
        except da.RunBusy:
            return ("busy", None)

    outcomes = in_threads(8, send)
    done = [run_id for kind, run_id in outcomes if kind == "ok"]
    assert done and len(done) == len(set(done)), outcomes
    assert all(code == "session.turn_open" for kind, code in outcomes if kind == "refused")
    history = echo.session("s-many").history()
    inputs = [m.content for m in history if m.role == "user"]
    assert len(inputs) == len(set(inputs)) == len(done)
    turns = Run.objects.filter(session_id="s-many").exclude(run_id__endswith=">session")
    assert sorted(turns.values_list("run_id", flat=True)) == sorted(done)


def test_concurrent_waiting_deliveries_all_get_the_turns_answer():
    """Four deliveries of one key at once, each waiting for its answer (``wait=True``): the
    first drives the turn, the others wait for it; none gets ``RunBusy``."""
    from tests.support.holes import slow_chat

    results = in_threads(
        4, lambda i: slow_chat.session("s-wait").send_once("d-1", "Order 7?", wait=True)
    )
    assert {(r.status, r.answer) for r in results} == {("answered", "shipped")}
    names = [r.name for r in Journal(DjangoStore()).records("s-wait>event/d-1")]
    assert names.count("model:1") == names.count("tool:call_1_1") == 1
