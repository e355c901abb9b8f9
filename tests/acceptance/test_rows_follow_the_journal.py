"""The journal is the truth: a process killed (SIGKILL) between a command's journal record
and the rows that project it leaves nothing wedged, and nothing runs twice. Found by the
simulator (docs/simulation.md, "What it found on the fixed engine"), replayed here with real
processes on PostgreSQL; side effects are counted outside the journal (``test_effects``).

* a fork whose maker died after creating its row, or half-way through the copy, is never
  driven (from scratch or from a partial journal): it stays failed, saying so;
* a decision journaled by a process that died before queueing the run is finished by the
  next decision on the call (an edited approval runs exactly its edit, once);
* a resolution journaled by a process that died before closing the halt is finished by the
  next resolution, or by a drive.
"""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth.models import User

import durable_agents as da
from durable_agents.celery.recovery import recover
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.support.agents import count_effects, effects_connection
from tests.support.procs import run_json

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
]


def drive(run_id: str, agent: str = "hole-charge", **env: str) -> tuple[int, dict | None]:
    return run_json("tests.support.drive", agent, run_id, "go", **env)


def command(*args: str, crash_at: str) -> int:
    code, _ = run_json("tests.support.holes_child", *args, DURABLE_AGENTS_CRASH_AT=crash_at)
    return code


def until_free(fn, timeout: float = 20.0):
    """Call ``fn`` until the killed process's lease (one second) has lapsed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (da.RunBusy, da.HaltInFlight):
            assert time.monotonic() < deadline, "the killed process's lease never lapsed"
            time.sleep(0.1)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "crash_at,alias",
    # Half-copied: everything but ``fork:done``, whose transaction (SQLite) dies with it.
    [("after-fork-row", "default"), ("store:after-insert:fork:done", "sqlite")],
    ids=["nothing-copied", "half-copied"],
)
def test_a_fork_whose_maker_was_killed_is_never_driven(crash_at, alias):
    source = f"rows-fork-{alias}"
    assert drive(source, DA_DATABASE=alias)[1]["status"] == "finished"
    code, _ = run_json(
        "tests.support.holes_child",
        "fork",
        source,
        "0",
        DA_DATABASE=alias,
        DURABLE_AGENTS_CRASH_AT=crash_at,
    )
    assert code == -9
    store = DjangoStore(using=alias)
    fork_id = f"{source}.fork-1"
    row = store.get_run(fork_id)
    assert row.status == "failed" and row.last_error["code"] == "history.fork_incomplete"
    copied = [r.name for r in Journal(store).records(fork_id)]
    assert "fork:done" not in copied and (alias == "default" or "run:start" in copied)
    assert recover_on(store) == []
    with pytest.raises(da.ConfigError) as info:
        until_free(lambda: da.resume(fork_id, store=store))
    assert info.value.code == "history.fork_incomplete"
    assert recover_on(store) == []
    assert count_effects(source) == {"call_1_1": 1} and count_effects(fork_id) == {}
    assert "model:1" not in [r.name for r in Journal(store).records(fork_id)]


def recover_on(store: DjangoStore) -> list[str]:
    from durable_agents.engine.commands.recovery import recover as recover_pass

    return recover_pass(store=store)


@pytest.mark.timeout(90)
def test_a_decision_killed_before_the_run_was_queued_is_finished_by_deciding_again():
    run_id = "rows-approve"
    assert drive(run_id, "gated")[1] == {"status": "awaiting_approval", "calls": ["call_1_1"]}
    assert command("approve", run_id, "call_1_1", "yes", crash_at="after-decision:call_1_1") == -9
    store = DjangoStore()
    assert Journal(store).get(run_id, "approval:call_1_1").get("approved") is True
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    assert store.get_approval_request(run_id, "call_1_1").status == "pending"
    assert recover() == [], "a run paused on a person is not recovery's"
    outcome = da.approve(run_id, "call_1_1", True, by="bob")
    assert outcome.status == "approved"
    assert store.get_approval_request(run_id, "call_1_1").status == "approved"
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert count_effects(run_id) == {"call_1_1": 1}


@pytest.mark.timeout(90)
def test_an_edited_approval_killed_before_the_run_was_queued_runs_the_edit_once():
    """ann approves with an edit (200 instead of 500) and is killed after the journal took
    it. bob's plain approval is refused (the standing decision is ann's), yet it moves the
    run on: the refund runs once, with ann's arguments."""
    run_id = "rows-approve-edit"
    assert drive(run_id, "gated")[1] == {"status": "awaiting_approval", "calls": ["call_1_1"]}
    edit = json.dumps({"order_id": "7", "cents": 200})
    crash_at = "after-decision:call_1_1"
    assert command("approve", run_id, "call_1_1", "yes", edit, crash_at=crash_at) == -9
    store = DjangoStore()
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    assert store.get_approval_request(run_id, "call_1_1").status == "pending"
    with pytest.raises(da.ApprovalAlreadyDecided) as info:
        da.approve(run_id, "call_1_1", True, by="bob")
    assert info.value.details["standing"]["arguments"] == {"order_id": "7", "cents": 200}
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert store.get_approval_request(run_id, "call_1_1").status == "approved"
    assert Journal(store).get(run_id, "tool:call_1_1").get("result") == {"refunded": 200}
    assert count_effects(run_id) == {"call_1_1": 1}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("then", ["resolve-again", "resume"])
def test_a_resolution_killed_before_the_halt_was_closed_is_finished(then):
    run_id = f"rows-resolve-{then}"
    assert drive(run_id, DA_CRASH_INSIDE="call_1_1")[0] == -9
    assert drive(run_id)[1] == {"status": "halted", "halts": ["call_1_1"]}
    outcome = json.dumps({"charged": "7"})
    crash_at = "after-resolution:call_1_1"
    assert command("resolve", run_id, "call_1_1", outcome, crash_at=crash_at) == -9
    store = DjangoStore()
    assert Journal(store).get(run_id, "tool:call_1_1").get("reconciled")
    [halt] = store.list_halts(run_id=run_id)
    assert halt.status == "open" and Run.objects.get(run_id=run_id).status == "halted"
    if then == "resolve-again":
        # Finished from the journal at once: the halt closed and the run queued (its
        # hand-over may find the dead process's lease not yet lapsed; recovery retries).
        da.resolve_halt(run_id, "call_1_1", {"charged": "7"}, by="bob")
        assert Run.objects.get(run_id=run_id).status in ("queued", "finished")
    assert until_free(lambda: da.resume(run_id)).answer == "charged"
    assert store.list_halts(run_id=run_id) == []
    [halt] = store.list_halts(run_id=run_id, status=None)
    assert halt.status == "resolved" and halt.resolution["result"] == {"charged": "7"}
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert count_effects(run_id) == {"call_1_1": 1}


@pytest.fixture(autouse=True)
def _people():
    """The site's people: ``ann`` acts in the killed processes, ``bob`` here afterwards."""
    for name in ("ann", "bob"):
        User.objects.create_superuser(name, f"{name}@example.com", "pw")


@pytest.fixture(autouse=True)
def _effects_table():
    effects_connection().close()  # created before any child counts an effect


@pytest.mark.timeout(90)
def test_a_quorum_vote_killed_before_its_decision_is_finished_by_the_sweep():
    """bob approves; ann's approval, the second of the two group finance needs, is saved and
    her process is killed before anything counts it or journals the decision. Nobody votes
    again: the timer sweep finishes the quorum, and the payout runs once."""
    from django.contrib.auth.models import Group

    from durable_agents.engine.commands.timers import wake_timers

    Group.objects.create(name="finance").user_set.add(*User.objects.all())
    run_id = "rows-quorum-vote"
    assert drive(run_id, "quorum")[1] == {"status": "awaiting_approval", "calls": ["call_1_1"]}
    assert da.approve(run_id, "call_1_1", True, by="bob").status == "pending"
    assert command("approve", run_id, "call_1_1", "yes", crash_at="after-vote:call_1_1") == -9
    store = DjangoStore()
    assert {d.approver for d in store.list_decisions(run_id, "call_1_1")} == {"ann", "bob"}
    assert Journal(store).get(run_id, "approval:call_1_1") is None
    assert Run.objects.get(run_id=run_id).status == "awaiting_approval"
    assert run_id in wake_timers(store=store)
    assert Journal(store).get(run_id, "approval:call_1_1").get("by") == "ann"
    # Every write attributed: bob's vote, and ann's decision (her vote's row died with her).
    logged = [(a.actor, a.action) for a in store.list_actions(run_id=run_id)]
    assert ("bob", "approve") in logged and ("ann", "finish-decision") in logged
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert count_effects(run_id) == {"call_1_1": 1}
