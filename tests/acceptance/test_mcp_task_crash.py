"""A long MCP call run as a task, its Celery worker SIGKILLed while polling (issue 45).

A real ``celery worker`` (PostgreSQL, Redis) drives a side-effect call that the task test
server (``tests/support/mcp_task_server.py``, its own process over HTTP) runs as a task.
Once the task id is journaled the worker's whole process group is SIGKILLed: the task goes
on in the server. A second worker, handed the run by recovery, polls the same task: the run
finishes with the task's result, nothing halts, and the server counts exactly one call.
Then that worker drives a slow plain call: its progress reaches a follower of the run live
(``agent.events``), as journal notes at most once a second.
Effects are counted by the server, in a file outside the journal."""

from __future__ import annotations

import importlib
import os
import signal
import uuid

import pytest
from celery import _state as celery_state

import durable_agents.tasks  # noqa: F401  (registers drive_run with the test's Celery app)
from durable_agents.celery.recovery import recover
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.support.mcp_servers import effects
from tests.support.mcp_task_servers import TaskServer
from tests.support.workers import CeleryProcesses, CeleryTarget, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

TTL = 2.0  # the workers' lease: a SIGKILLed worker's run is free again after it


@pytest.fixture
def ledger(tmp_path):
    server = TaskServer(tmp_path / "effects.jsonl", DA_MCP_TASK_SECONDS="4", DA_MCP_POLL_MS="200")
    server.start()
    yield server
    server.kill()


@pytest.fixture
def agents(ledger, monkeypatch):
    """The agents module, loaded in this process with the server's address (``start``
    lists the tools here first)."""
    monkeypatch.setenv("DA_MCP_TASK_URL", ledger.url)
    module = importlib.import_module("tests.support.mcp_task_agents")
    module = importlib.reload(module) if ledger.url != module.URL else module
    yield module
    module.ledger.close()


@pytest.fixture
def celery(settings, tmp_path):
    target = CeleryTarget.fresh(os.environ.get("PYTEST_XDIST_WORKER", "master"))
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "DISPATCH": "celery",
        "CELERY_QUEUE": target.queue,
        "LEASE_TTL": TTL,
    }
    previous = celery_state.get_current_app()
    app = target.app()
    target.purge(app)
    procs = CeleryProcesses(target, tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()
        target.purge(app)
        app.close()
        previous.set_current()
        target.clean()


def worker(celery, ledger):
    return celery.worker(
        DA_LEASE_TTL=str(TTL),
        DA_EXTRA_AGENTS="tests.support.mcp_task_agents",
        DA_MCP_TASK_URL=ledger.url,
    ).wait_ready()


def test_a_worker_killed_while_polling_a_task_resumes_polling_it_and_progress_is_live(
    celery, ledger, agents
):
    run_id = f"mcp-task-{uuid.uuid4().hex[:8]}"
    journal = Journal(DjangoStore())
    first = worker(celery, ledger)
    agents.mcp_task_crash.start("move", run_id=run_id)
    handle = wait_for(
        lambda: journal.get(run_id, names.handle("call_1_1")), 30, "the task id journaled"
    )
    task_id = handle.get("handle")["task_id"]
    first.signal_group(signal.SIGKILL)  # mid-poll: the task works for 4 s
    first.wait_exit(10)
    assert journal.get(run_id, names.tool("call_1_1")) is None
    assert [e["task_id"] for e in effects(ledger.effects, "transfer")] == [task_id]

    second = worker(celery, ledger)

    def finished():
        if Run.objects.get(run_id=run_id).status == "finished":
            return True
        recover()  # hands the run over once the dead worker's lease is out
        return False

    wait_for(finished, 40, "the second worker to finish the run", interval=0.5)
    result = journal.get(run_id, names.tool("call_1_1")).get("result")
    assert result["structuredContent"]["task"] == task_id
    assert len(effects(ledger.effects, "transfer")) == 1  # tools/call went out once
    assert DjangoStore().list_halts(run_id=run_id) == []
    assert "drive_run" in second.log()

    # The second worker drives a slow plain call: its progress reaches a follower live.
    progress_run = f"mcp-progress-{uuid.uuid4().hex[:8]}"
    agents.mcp_progress.start("crunch", run_id=progress_run)
    seen = []
    in_flight = []  # for each note: was the call still running when the follower got it?
    for record in agents.mcp_progress.events(progress_run):
        seen.append(record)
        if record.name.startswith(names.PROGRESS):
            in_flight.append(journal.get(progress_run, names.tool("call_1_1")) is None)
    order = [r.name for r in seen]
    notes = [r for r in seen if r.name.startswith(names.PROGRESS)]
    assert notes, order
    # Live: the first note reached the follower while the call was still running.
    assert in_flight[0], order
    assert all(n.body.get("total") == 12 for n in notes)
    assert len(notes) <= 5  # at most one a second over a 3 s call
    assert Run.objects.get(run_id=progress_run).status == "finished"
