"""A decision is bound to the definition of a tool the site did not write.

An MCP server's tool carries ``definition_digest`` (its schema, description and annotations
as the server declared them). A gated call of such a tool whose definition changed between
the asking and the running (a server's next version, listed by a worker started since) is
asked again, even about the same arguments; a Python tool (no digest) keeps its decision.
Here the digest is set on a Python tool by hand: the engine's rule, on the in-memory store
(the real servers: tests/mcp/test_server_changes.py)."""

from __future__ import annotations

import pytest

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel


def remote_agent(fired, digest, *, name="defs", approval=True, deadline=None):
    """The agent as a worker loads it, with ``pay`` declared as ``digest`` by its server."""

    @da.tool(requires_approval=approval, deadline=deadline)
    def pay(cents: int) -> str:
        """Pay out."""
        fired.append(cents)
        return f"paid {cents}"

    pay.definition_digest = digest
    pay.origin = {"kind": "mcp", "server": "crm", "remote_tool": "pay"}
    script = [scripted.calls(scripted.call("pay", {"cents": 5})), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [pay])


def deploy(agent):
    """``agent`` is the one its name finds from now on (the last made under a name wins), as
    in a worker started after a deploy."""
    return agent


def test_a_tool_changed_between_asking_and_deciding_is_asked_again(store, fired):
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r", "pay", store=store)
    asked = store.get_approval_request("r", "call_1_1")
    assert asked.tool_digest == "v1"
    deploy(remote_agent(fired, "v2"))
    da.approve("r", "call_1_1", True, by="ann", store=store)
    assert fired == []  # approved for the tool as it was: not fired under the new one
    again = store.get_approval_request("r", "call_1_1")
    assert (again.status, again.tool_digest) == ("pending", "v2")
    assert again.arguments == again.previous_arguments == {"cents": 5}
    assert store.get_run("r").status == "awaiting_approval"
    first = Journal(store).get("r", "approval:call_1_1")
    assert first.get("tool_digest") == "v1" and first.get("approved") is True
    da.approve("r", "call_1_1", True, by="ann", store=store)
    assert fired == [5]
    assert store.get_run("r").status == "finished"
    da.resume("r", store=store)
    assert fired == [5]


def test_a_second_change_is_another_question(store, fired):
    """Each definition is its own question, with a decision name of its own: a change after
    the call was asked again is asked about once more, never stuck on the earlier answer."""
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r2", "pay", store=store)
    deploy(remote_agent(fired, "v2"))
    da.approve("r2", "call_1_1", True, by="ann", store=store)
    assert store.get_approval_request("r2", "call_1_1").tool_digest == "v2"
    deploy(remote_agent(fired, "v3"))
    da.approve("r2", "call_1_1", True, by="ann", store=store)
    assert fired == []
    third = store.get_approval_request("r2", "call_1_1")
    assert (third.status, third.tool_digest) == ("pending", "v3")
    da.approve("r2", "call_1_1", True, by="ann", store=store)
    assert fired == [5] and store.get_run("r2").status == "finished"
    decisions = [
        r.name for r in Journal(store).records("r2") if r.name.startswith("approval:call_1_1")
    ]
    assert len(decisions) == len(set(decisions)) == 3


def test_a_denial_stands_whatever_the_tool_became(store, fired):
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r3", "pay", store=store)
    deploy(remote_agent(fired, "v2"))
    da.approve("r3", "call_1_1", False, by="ann", note="no", store=store)
    assert fired == []
    assert store.get_run("r3").status == "finished"
    assert store.get_approval_request("r3", "call_1_1").status == "denied"
    assert Journal(store).get("r3", "tool:call_1_1").get("is_error") is True


def test_the_same_definition_keeps_its_decision(store, fired):
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r4", "pay", store=store)
    deploy(remote_agent(fired, "v1"))  # a restart, nothing changed
    da.approve("r4", "call_1_1", True, by="ann", store=store)
    assert fired == [5] and store.get_run("r4").status == "finished"
    assert store.get_approval_request("r4", "call_1_1").previous_arguments is None


def test_a_python_tool_has_no_definition_and_keeps_its_decision(store, fired):
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, None).run("r5", "pay", store=store)
    assert store.get_approval_request("r5", "call_1_1").tool_digest == ""
    deploy(remote_agent(fired, None))
    da.approve("r5", "call_1_1", True, by="ann", store=store)
    assert fired == [5]
    assert "tool_digest" not in Journal(store).get("r5", "approval:call_1_1").body


def test_the_fingerprint_names_the_server_whose_tools_changed(store, fired):
    """The run's start records a digest per tool server (``sources``); a resume under a
    server whose tool changed is drift naming it, by the drift policy."""
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r6", "pay", store=store)
    start = Journal(store).get("r6", "run:start")
    assert set(start.get("fingerprint")["sources"]) == {"crm"}
    deploy(remote_agent(fired, "v2"))
    da.approve("r6", "call_1_1", True, by="ann", store=store)
    [drift] = [r for r in Journal(store).records("r6") if r.name.startswith("@drift")]
    assert drift.get("changes")["sources_changed"] == ["crm"]
    assert drift.get("changes")["tools_changed"] == ["pay"]


def test_a_python_tool_fingerprint_is_unchanged_by_sources():
    from durable_agents.engine.fingerprint import fingerprint
    from durable_agents.engine.model import ToolSpec

    spec = ToolSpec("pay", "Pay out.", {"type": "object"})
    plain = fingerprint("m", "i", [spec])
    assert "sources" not in plain
    assert plain == fingerprint("m", "i", [spec], {})
    assert fingerprint("m", "i", [spec], {"pay": ("crm", "v1")})["hash"] != plain["hash"]


def test_a_call_sent_under_its_decision_is_resumed_not_asked_again(store, clock):
    """An approved call that handed its work off (an MCP task: its handle journaled) and
    whose worker died: a resume under a changed definition waits on the work it sent. Asking
    again there would let a denial invent a result for work the server is doing."""
    from tests.support.doubles import Crash

    sent: list = []
    waited: list = []

    def agent(digest):
        @da.tool(requires_approval=True)
        def book(slot: str, ctx: da.ToolContext) -> dict:
            """Book a slot."""
            ticket = ctx.handle()
            if ticket is None:
                sent.append(slot)
                ticket = ctx.keep_handle({"ticket": f"T-{slot}"})
                if len(sent) == 1:
                    raise Crash()
            waited.append(ticket["ticket"])
            return {"booked": slot}

        book.resumes = True
        book.definition_digest = digest
        book.origin = {"kind": "mcp", "server": "cal", "remote_tool": "book"}
        script = [scripted.calls(scripted.call("book", {"slot": "9am"})), scripted.text("ok")]
        return da.Agent("defs-handoff", ScriptedModel(script), "", [book])

    with pytest.raises(da.ApprovalPending):
        agent("v1").run("h", "book", store=store)
    with pytest.raises(Crash):
        da.approve("h", "call_1_1", True, by="ann", store=store)
    assert sent == ["9am"]
    agent("v2")  # the server's next version, listed by the worker that resumes
    clock.advance(60)  # the dead driver's lease expires
    assert da.resume("h", store=store).answer == "ok"
    assert sent == ["9am"] and waited == ["T-9am"]
    assert store.get_approval_request("h", "call_1_1").previous_arguments is None
    assert store.list_halts(run_id="h") == []


def test_a_decision_never_marks_the_request_about_a_newer_definition(store, fired, at_point):
    """A person approves the call asked about definition v2 while a drive under v3 asks
    again about the same arguments (between the decision's record and its rows): the v3
    request stays pending for a person, never marked decided by the v2 decision (a run
    awaiting a request nobody is shown)."""
    from durable_agents.engine.commands.runs import drive_quietly

    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1").run("r7", "pay", store=store)
    deploy(remote_agent(fired, "v2"))
    da.approve("r7", "call_1_1", True, by="ann", store=store)  # asked again about v2
    assert store.get_approval_request("r7", "call_1_1").tool_digest == "v2"

    def newer_worker_asks_again():
        deploy(remote_agent(fired, "v3"))
        drive_quietly("r7", store=store)

    at_point("after-decision:call_1_1", newer_worker_asks_again)
    da.approve("r7", "call_1_1", True, by="ann", store=store)
    assert fired == []
    request = store.get_approval_request("r7", "call_1_1")
    assert (request.status, request.tool_digest) == ("pending", "v3")
    assert store.get_run("r7").status == "awaiting_approval"
    da.approve("r7", "call_1_1", True, by="ann", store=store)
    assert fired == [5] and store.get_run("r7").status == "finished"


def test_an_expiry_never_marks_the_request_about_a_newer_definition(store, fired, at_point, clock):
    """The sweep expires the call asked about v2 while a worker under v3 asks again about the
    same arguments (between the expiry's record and its row): the v3 request stays pending
    for a person, never marked expired by v2's expiry."""
    from durable_agents.engine.commands.runs import drive_quietly
    from durable_agents.engine.commands.timers import wake_timers

    soon = da.Deadline(expire=60)
    with pytest.raises(da.ApprovalPending):
        remote_agent(fired, "v1", deadline=soon).run("r8", "pay", store=store)
    deploy(remote_agent(fired, "v2", deadline=soon))
    da.approve("r8", "call_1_1", True, by="ann", store=store)  # asked again about v2
    assert store.get_approval_request("r8", "call_1_1").tool_digest == "v2"

    def newer_worker_asks_again():
        deploy(remote_agent(fired, "v3", deadline=soon))
        drive_quietly("r8", store=store)

    at_point("after-expiry-decision:call_1_1", newer_worker_asks_again)
    clock.advance(120)
    wake_timers(store=store)
    request = store.get_approval_request("r8", "call_1_1")
    assert (request.status, request.tool_digest) == ("pending", "v3")
    assert store.get_run("r8").status == "awaiting_approval"
    assert fired == []
