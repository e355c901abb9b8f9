"""What a run costs in statements on PostgreSQL (issue 17, cheap runs): a new one-turn run
is two round trips — start (row, lease, header, ``run:start``) and the finish (the final
turn, ``run:complete``, row, lease release) — and reads nothing; a resume reads its journal
once.

Counted with ``connection.execute_wrapper`` on a store without prepared statements, so every
statement goes through Django's cursor (the prepared path sends the same statements)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.errors import LeaseLost
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.stores import DB

pytestmark = DB

_J = "durable_agents_journalentry"

one_turn = da.Agent("round-trips-one-turn", ScriptedModel([scripted.text("Hi.")]), "Say hi.")


@da.tool(read_only=True)
def noop(n: int) -> dict:
    """Do nothing."""
    return {"n": n}


two_turns = da.Agent(
    "round-trips-two-turns",
    ScriptedModel([scripted.calls(scripted.call("noop", {"n": 1})), scripted.text("Done.")]),
    "Call noop once.",
    [noop],
)


@contextmanager
def statements(alias: str = "default") -> Iterator[list[str]]:
    seen: list[str] = []

    def count(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(count):
        yield seen


def journal_reads(seen: list[str]) -> list[str]:
    return [s for s in seen if s.lstrip().upper().startswith("SELECT") and _J in s]


@pytest.fixture
def store() -> DjangoStore:
    return DjangoStore(using="default", prepared=False)


def test_a_new_one_turn_run_is_two_round_trips_and_reads_nothing(store):
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        result = one_turn.run(run_id, "Hello", store=store)
    assert result.answer == "Hi."
    assert len(seen) == 2, seen
    assert journal_reads(seen) == []
    names = [r.name for r in Journal(store).records(run_id)]
    assert names == ["@journal", "run:start", "model:1", "run:complete"]
    run = store.get_run(run_id)
    assert (run.status, run.answer, run.turns) == ("finished", "Hi.", 1)
    assert store.get_lease(run_id) is None, "the finish released the lease"


def test_each_later_record_is_one_round_trip(store):
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        two_turns.run(run_id, "Go", store=store)
    # start, model:1, tool result, finish (model:2 and run:complete)
    assert len(seen) == 4, seen
    assert journal_reads(seen) == []


def test_a_resume_reads_its_journal_once(store):
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    first = two_turns.run(run_id, "Go", store=store)
    with statements() as seen:
        again = two_turns.run(run_id, None, store=store)
    assert again.answer == first.answer
    assert len(journal_reads(seen)) == 1, seen


def test_a_finished_run_entered_again_is_one_round_trip(store):
    """A redelivered message re-enters a finished run with its input: the start attempt
    finds the run and brings back its journal and row in the same statement; the answer
    comes from them, with no read after it and no write (issue 33, hot path)."""
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    first = one_turn.run(run_id, "Hello", store=store)
    with statements() as seen:
        again = one_turn.run(run_id, "Hello", store=store)
    assert (again.answer, again.turns) == (first.answer, first.turns)
    assert len(seen) == 1, seen
    assert journal_reads(seen) == []


def test_a_start_asks_whether_the_id_is_spent_only_in_its_own_statement(store):
    """Whether the id is spent (a deleted or pruned run held it) is asked inside the start
    statement, never by a statement of its own: not on a new run, nor on a start of a run
    that exists (a redelivered ``agent.start``)."""
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    with statements() as seen:
        one_turn.run(run_id, "Hello", store=store)
        assert one_turn.start("Hello", run_id=run_id, store=store) == run_id
    asks = [s for s in seen if "durable_agents_spentrunid" in s]
    assert len(asks) == 2 and all(s.lstrip().startswith("WITH r AS") for s in asks)


def test_a_finished_run_whose_row_disagrees_is_repaired_from_the_journal(store):
    """The row read with the journal says "running" (left by a crash between the journal's
    end and the row's): the re-entry repairs it from the journal, as the journal says."""
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    one_turn.run(run_id, "Hello", store=store)
    store.update_run(run_id, {"status": "running", "answer": None})
    again = one_turn.run(run_id, "Hello", store=store)
    assert again.answer == "Hi."
    run = store.get_run(run_id)
    assert (run.status, run.answer) == ("finished", "Hi.")


def test_a_run_row_made_beforehand_takes_the_usual_path(store):
    """A run that exists (queued by ``start``, a fork, a session turn) is not started again
    in one write: the drive reads it, leases it and records ``run:start`` as before."""
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    from durable_agents.engine.ports import RunInfo

    store.create_run(RunInfo(run_id=run_id, agent=one_turn.name, input="Hello"))
    assert one_turn.run(run_id, "Hello", store=store).answer == "Hi."
    names = [r.name for r in Journal(store).records(run_id)]
    assert names == ["@journal", "run:start", "model:1", "run:complete"]
    assert store.get_lease(run_id) is None


class TakenBeforeTheFinish(DjangoStore):
    """Another driver takes the lease (the first one's expired) just before the finish."""

    def finish_run_with(self, run_id, records, *, fence, run_changes=None):
        with self.connection.cursor() as cursor:
            cursor.execute(
                "UPDATE durable_agents_lease SET expires_at = now() - interval '1 second' "
                "WHERE run_id = %s",
                [run_id],
            )
        assert self.acquire_lease(run_id, "other", "tok-other", 30)
        return super().finish_run_with(run_id, records, fence=fence, run_changes=run_changes)


def test_a_driver_whose_lease_was_taken_does_not_finish():
    """The one-write finish is fenced like every write: a driver that lost its lease before
    its final turn stores neither the turn nor ``run:complete``, leaves the row unfinished
    and the new holder's lease."""
    store = TakenBeforeTheFinish(using="default", prepared=False)
    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    with pytest.raises(LeaseLost):
        one_turn.run(run_id, "Hello", store=store)
    assert store.get(run_id, "run:complete") is None
    assert store.get(run_id, "model:1") is None
    assert store.get_run(run_id).status != "finished"
    lease = store.get_lease(run_id)
    assert (lease.token, lease.live) == ("tok-other", True)


def test_a_run_started_for_a_worker_is_one_write_and_its_drive_reads_once(store):
    """``start`` writes the row, the header and ``run:start`` in one statement; the worker's
    ``resume`` reads the row, takes the lease, reads the journal once (no second read for
    what was written between a read and the lease), marks it running and finishes."""
    from durable_agents.engine.commands.runs import resume, start
    from tests.support.wiring import wired

    run_id = f"rt-{uuid.uuid4().hex[:10]}"
    with wired(dispatcher=lambda run_id: None), statements() as seen:
        start(one_turn, "Hello", run_id, store=store)
    assert len(seen) == 1, seen
    with statements() as seen:
        assert resume(run_id, store=store).answer == "Hi."
    assert len(journal_reads(seen)) == 1, seen
    assert len(seen) == 5, seen  # row, lease, journal, status, finish
    names = [r.name for r in Journal(store).records(run_id)]
    assert names == ["@journal", "run:start", "model:1", "run:complete"]
    assert store.get_lease(run_id) is None
