"""An MCP side effect whose driver dies after the request reached the server: the server
fires the refund and SIGKILLs the process driving the run before its answer arrives. A new
process resumes: the run halts with outcome unknown, never calls the server again, and a
person's resolution finishes it. The effect is counted by the server, in a file."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine.journal import Journal
from durable_agents.models import Run
from tests.support.mcp_servers import effects
from tests.support.procs import run_json

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]


def test_a_driver_killed_after_the_request_reached_the_server_halts_and_nothing_fires_twice(
    tmp_path, monkeypatch
):
    path = tmp_path / "effects.jsonl"
    env = {"DA_MCP_EFFECTS": str(path), "DA_EXTRA_AGENTS": "tests.support.mcp_agents.mcp_crash"}
    run_id = "mcp-crash-1"
    code, _ = run_json("tests.support.drive", "mcp-crash", run_id, "go", **env)
    assert code == -9  # killed by the server, after the refund, before its answer
    assert [e["order_id"] for e in effects(path)] == ["c1"]
    store = DjangoStore()
    assert Journal(store).get(run_id, "attempt:call_1_1:1") is not None
    assert Journal(store).get(run_id, "tool:call_1_1") is None
    # A new process resumes: it halts on the live attempt and never calls the server.
    code, out = run_json("tests.support.drive", "mcp-crash", run_id, "go", **env)
    assert (code, out) == (0, {"status": "halted", "halts": ["call_1_1"]})
    assert Run.objects.get(run_id=run_id).status == "halted"
    assert len(effects(path)) == 1
    # A person records what happened; the run finishes without calling the server again.
    monkeypatch.setenv("DA_MCP_EFFECTS", str(path))
    from tests.support import mcp_agents  # noqa: F401  (registers mcp-crash here too)

    User.objects.create_superuser("ann", "ann@example.com", "pw")
    try:
        da.resolve_halt(run_id, "call_1_1", {"refunded": True}, evidence={"ledger": "c1"}, by="ann")
    finally:
        da.mcp.close_all()  # the server this process started to list the tools
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert len(effects(path)) == 1
