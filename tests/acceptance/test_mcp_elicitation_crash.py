"""A driver SIGKILLed while its MCP call waits for staff's answer to the server's question.
Once its lease is gone, an answer is refused (``interrupt.expired``, nothing written): it
would reach nobody. A new process resumes: the side-effect call halts (outcome unknown) and
the server is never sent the call again; a person's resolution finishes the run. The
server counts each round of the call and the refund in a file."""

from __future__ import annotations

import json
import os
import signal

import pytest
from django.contrib.auth.models import User

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.errors import WaitError
from durable_agents.models import JournalEntry, Run
from tests.support import mcp_elicit_agents
from tests.support.mcp_servers import effects
from tests.support.procs import run_json, start
from tests.support.workers import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

QUESTION = "mcp.call_1_1.1"


def test_a_driver_killed_while_waiting_for_staff_halts_and_a_late_answer_is_refused():
    path = str(mcp_elicit_agents.EFFECTS)
    env = {
        "DA_MCP_EFFECTS": path,
        "DA_EXTRA_AGENTS": "tests.support.mcp_elicit_agents.agents",
        "DA_LEASE_TTL": "1",
    }
    resume_env = {k: v for k, v in env.items() if k != "DA_LEASE_TTL"}  # run_json sets it
    run_id = f"el-crash-{os.getpid()}"
    rounds = len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund_round"))
    refunds = len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund"))
    child = start(["tests.support.drive", "el-ask", run_id, "go"], **env)
    try:
        wait_for(
            lambda: JournalEntry.objects.filter(run_id=run_id, name=names.wait(QUESTION)).exists(),
            60,
            "the driver to journal the server's question",
        )
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    store = DjangoStore()
    assert store.get(run_id, names.attempt("call_1_1", 1)) is not None
    assert store.get(run_id, names.tool("call_1_1")) is None
    wait_for(
        lambda: not (lease := store.get_lease(run_id)) or not lease.live,
        10,
        "the killed driver's lease to expire",
    )
    User.objects.create_superuser("ann", "ann@example.com", "pw")
    before = JournalEntry.objects.filter(run_id=run_id).count()
    with pytest.raises(WaitError) as info:
        da.answer_interrupt(run_id, QUESTION, {"approve": True}, by="ann")
    assert info.value.code == "interrupt.expired"
    assert JournalEntry.objects.filter(run_id=run_id).count() == before

    # A new process resumes: the call halts on its attempt; the server is not called again.
    code, out = run_json("tests.support.drive", "el-ask", run_id, "go", **resume_env)
    assert (code, out) == (0, {"status": "halted", "halts": ["call_1_1"]})
    assert len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund_round")) == rounds + 1
    assert len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund")) == refunds
    with pytest.raises(WaitError) as info:
        da.answer_interrupt(run_id, QUESTION, {"approve": True}, by="ann")
    assert info.value.code == "interrupt.expired"

    # A person records what happened (the server never refunded); the run finishes.
    try:
        da.resolve_halt(run_id, "call_1_1", {"refunded": 0}, evidence={"crm": "none"}, by="ann")
    finally:
        da.mcp.close_all()
    assert Run.objects.get(run_id=run_id).status == "finished"
    assert len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund_round")) == rounds + 1
    assert len(effects(mcp_elicit_agents.EFFECTS, "confirmed_refund")) == refunds
    asked = json.loads(JournalEntry.objects.get(run_id=run_id, name=names.wait(QUESTION)).data)
    assert asked["live"] and asked["holder"]
    # The question was never answered nor delivered.
    assert not JournalEntry.objects.filter(run_id=run_id, name=names.waited(QUESTION)).exists()
