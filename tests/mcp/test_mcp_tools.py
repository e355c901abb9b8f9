"""Tools from real MCP servers (stdio and streamable HTTP) driven by the engine: names,
schemas and validation, safety classes, approvals, error results, servers that are down,
die mid-call or restart between turns. Effects are counted by the server, in a file."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

import durable_agents as da
from durable_agents.admin.readable import origin_of
from durable_agents.engine.journal import Journal
from durable_agents.engine.tools import call_key
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.mcp_servers import effects, free_port, stdio

pytestmark = pytest.mark.timeout(60)


def agent(name, tools, *turns, requests=None):
    model = ScriptedModel([*turns, scripted.text("done")])
    if requests is not None:
        model = ScriptedModel([*turns, scripted.text("done")], on_request=requests.append)
    return da.Agent(name, model, "Use the tools.", tools)


def result_of(store, run_id, call_id):
    return Journal(store).get(run_id, f"tool:{call_id}")


def test_the_tool_list_becomes_durable_tools_and_bad_arguments_never_reach_the_server(
    store, crm, effects_file
):
    a = agent(
        "mcp-list",
        [crm],
        scripted.calls(scripted.call("crm__refund", {"order_id": "v1", "cents": "5"})),
        scripted.calls(scripted.call("crm__refund", {"order_id": "v1", "cents": 5, "x": 1})),
        scripted.calls(scripted.call("crm__refund", {"order_id": "v1", "cents": 5})),
    )
    tools = a.tools
    assert {"crm__lookup", "crm__refund", "crm__send_receipt", "crm__reject"} <= set(tools)
    refund = tools["crm__refund"]
    assert refund.parameters["required"] == ["order_id", "cents"]
    assert refund.description == "Refund part of an order."
    # Untrusted: every tool of the server is a side effect, at most once.
    assert all(not t.safety.retry_safe for t in tools.values())
    assert refund.origin["server"] == "crm" and refund.origin["class_from"] == "default"
    assert a.run("v-run", "refund", store=store).answer == "done"
    bad = result_of(store, "v-run", "call_1_1")
    assert bad.get("is_error") and "cents" in bad.get("result")["error"]
    assert result_of(store, "v-run", "call_2_1").get("is_error")  # an unknown field
    good = result_of(store, "v-run", "call_3_1")
    assert not good.get("is_error")
    assert json.loads(good.get("result")["content"][0]["text"])["refunded"] == 5
    assert [e["cents"] for e in effects(effects_file, "refund") if e["order_id"] == "v1"] == [5]


def test_trusted_annotations_choose_the_class_and_options_override_them(
    store, trusted, effects_file
):
    tools = agent("mcp-trust", [trusted]).tools
    classes = {n: t.origin["class"] for n, t in tools.items()}
    assert classes["crm-trusted__lookup"] == "read_only"
    assert classes["crm-trusted__send_receipt"] == "idempotent"  # idempotent, not destructive
    assert classes["crm-trusted__refund"] == "side_effect"  # destructive: no hint counts
    assert tools["crm-trusted__lookup"].safety.read_only
    # What the admin's cards (inbox, run page) say about where the tool comes from.
    assert origin_of(tools["crm-trusted__refund"]) == (
        "MCP server crm-trusted (stdio), tool refund; declares destructiveHint=True (trusted); "
        "runs as a side effect (at most once; a crash mid-call halts), the default for a "
        "server's tools"
    )
    assert "read-only" in origin_of(tools["crm-trusted__lookup"])
    assert tools["crm-trusted__send_receipt"].safety.idempotent
    # The engine's key fills the server's idempotency_key argument; the model never sees it.
    receipt = tools["crm-trusted__send_receipt"]
    assert "idempotency_key" not in receipt.parameters["properties"]
    a = agent(
        "mcp-trust",
        [trusted],
        scripted.calls(scripted.call("crm-trusted__send_receipt", {"order_id": "k1"})),
    )
    a.run("k-run", "receipt", store=store)
    [sent] = [e for e in effects(effects_file, "send_receipt") if e["order_id"] == "k1"]
    assert sent["key"] == call_key("k-run", "call_1_1")

    overridden = stdio(
        effects_file,
        name="crm-over",
        trust_annotations=True,
        tools={
            "lookup": da.mcp.ToolOptions(safety="side_effect"),
            "refund": da.mcp.ToolOptions(approval=True, rate="5/s", max_concurrent=2),
        },
        names={"whoami": "server_pid"},
    )
    try:
        tools = agent("mcp-over", [overridden]).tools
        assert not tools["crm-over__lookup"].safety.retry_safe
        assert tools["crm-over__lookup"].origin["class_from"] == "override"
        refund = tools["crm-over__refund"]
        assert refund.safety.gated and refund.max_concurrent == 2 and refund.rate is not None
        assert "server_pid" in tools and "crm-over__whoami" not in tools
    finally:
        overridden.close()


def test_names_that_collide_or_providers_refuse_are_config_errors(crm, effects_file):
    @da.tool(read_only=True)
    def crm__lookup(order_id: str) -> str:
        return order_id

    with pytest.raises(da.ConfigError) as info:
        _ = agent("mcp-clash", [crm__lookup, crm]).tools
    assert info.value.code == "config.tool_name" and "crm__lookup" in str(info.value)
    clash = stdio(effects_file, name="crm-clash", names={"lookup": "crm-clash__refund"})
    try:
        with pytest.raises(da.ConfigError, match="two of its tools"):
            _ = agent("mcp-clash2", [clash]).tools
    finally:
        clash.close()
    with pytest.raises(da.ConfigError):
        da.mcp.Server("crm.v2", command=["x"])  # a name providers would refuse
    with pytest.raises(da.ConfigError):
        da.mcp.Server("crm", command=["x"], tools={"refund": da.mcp.ToolOptions(safety="maybe")})


def test_an_approved_gated_call_fires_once_with_the_edited_arguments(store, effects_file):
    gated = stdio(
        effects_file, name="crm-gated", tools={"refund": da.mcp.ToolOptions(approval=True)}
    )
    try:
        a = agent(
            "mcp-gated",
            [gated],
            scripted.calls(scripted.call("crm-gated__refund", {"order_id": "g1", "cents": 900})),
        )
        with pytest.raises(da.ApprovalPending):
            a.run("g-run", "refund", store=store)
        assert effects(effects_file, "refund") == [] or all(
            e["order_id"] != "g1" for e in effects(effects_file, "refund")
        )
        with pytest.raises(da.ApprovalEditInvalid):
            da.approve("g-run", "call_1_1", True, by="ann", edit={"cents": "x"}, store=store)
        da.approve(
            "g-run", "call_1_1", True, by="ann", edit={"order_id": "g1", "cents": 200}, store=store
        )
        assert store.get_run("g-run").status == "finished"
        da.resume("g-run", store=store)  # nothing left to run
        fired = [e for e in effects(effects_file, "refund") if e["order_id"] == "g1"]
        assert [e["cents"] for e in fired] == [200]
    finally:
        gated.close()


def test_an_error_result_goes_back_to_the_model_journaled_whole(store, crm):
    requests: list = []
    a = agent(
        "mcp-error",
        [crm],
        scripted.calls(scripted.call("crm__reject", {"reason": "closed"})),
        requests=requests,
    )
    assert a.run("e-run", "try", store=store).answer == "done"
    record = result_of(store, "e-run", "call_1_1")
    assert record.get("is_error")
    result = record.get("result")
    assert result["isError"] is True and "refused: closed" in result["content"][0]["text"]
    assert "refused: closed" in json.dumps([m.content for m in requests[-1].messages])


def test_a_server_that_is_down_is_a_coded_error_quickly(store, effects_file):
    down = da.mcp.Server("down", url=f"http://127.0.0.1:{free_port()}/mcp")
    missing = da.mcp.Server("missing", command=["/nonexistent/mcp-server"])
    mute = da.mcp.Server(
        "mute", command=[sys.executable, "-c", "import time; time.sleep(30)"], connect_timeout=1
    )
    for server, code in (
        (down, "mcp.unavailable"),
        (missing, "mcp.unavailable"),
        (mute, "mcp.timeout"),
    ):
        started = time.monotonic()
        with pytest.raises(da.mcp.McpUnavailable) as info:
            agent(f"mcp-{server.name}", [server]).run(f"{server.name}-run", "go", store=store)
        assert info.value.code == code and info.value.retryable
        assert time.monotonic() - started < 5
        server.close()
    # The tools are listed before anything is written: no run was started.
    assert store.get_run("down-run") is None


def test_a_server_killed_mid_call_halts_a_side_effect_and_nothing_fires_twice(store, effects_file):
    dying = stdio(effects_file, name="crm-dying")
    try:
        a = agent(
            "mcp-dying",
            [dying],
            scripted.calls(scripted.call("crm-dying__refund_and_die", {"order_id": "d1"})),
        )
        with pytest.raises(da.OutcomeUnknown):
            a.run("d-run", "refund", store=store)
        assert store.get_run("d-run").status == "halted"
        with pytest.raises(da.OutcomeUnknown):
            da.resume("d-run", store=store)  # a live attempt halts again, never re-runs
        da.resolve_halt(
            "d-run",
            "call_1_1",
            result={"refunded": True},
            evidence={"ledger": "d1"},
            by="ann",
            store=store,
        )
        assert store.get_run("d-run").status == "finished"
        assert len([e for e in effects(effects_file) if e.get("order_id") == "d1"]) == 1
    finally:
        dying.close()


def test_a_read_only_call_that_times_out_is_an_error_not_a_halt(store, effects_file):
    slow = stdio(effects_file, name="crm-slow", trust_annotations=True, call_timeout=1)
    try:
        a = agent(
            "mcp-slow", [slow], scripted.calls(scripted.call("crm-slow__slow", {"seconds": 5}))
        )
        assert "crm-slow__slow" in a.tools  # the server started (seconds on a loaded machine)
        started = time.monotonic()
        assert a.run("s-run", "wait", store=store).answer == "done"
        assert time.monotonic() - started < 5
        record = result_of(store, "s-run", "call_1_1")
        assert record.get("is_error") and "did not answer" in json.dumps(record.get("result"))
    finally:
        slow.close()


def test_a_server_restarted_between_turns_is_reconnected(store, http_server):
    tickets = http_server.server(trust_annotations=True)
    try:
        requests: list = []
        a = agent(
            "mcp-restart",
            [tickets],
            scripted.calls(scripted.call("tickets__whoami", {})),
            scripted.calls(scripted.call("tickets__whoami", {})),
            requests=requests,
        )
        first_pid = http_server.proc.pid

        restarted = []

        def restart_after_turn_one(request):
            requests.append(request)
            if len(requests) == 2 and not restarted:  # the model's second turn
                http_server.kill()
                http_server.start()
                restarted.append(True)

        a.model.on_request = restart_after_turn_one
        assert a.run("h-run", "who", store=store).answer == "done"
        pids = [
            json.loads(result_of(store, "h-run", c).get("result")["content"][0]["text"])["pid"]
            for c in ("call_1_1", "call_2_1")
        ]
        assert pids == [first_pid, http_server.proc.pid] and pids[0] != pids[1]
    finally:
        tickets.close()


def test_a_stdio_server_that_died_between_turns_is_started_again(store, effects_file):
    server = stdio(effects_file, name="crm-restart", trust_annotations=True)
    requests: list = []

    def kill_the_server_before_turn_two(request):
        requests.append(request)
        if len(requests) == 2:
            [first] = [m for m in request.messages if m.role == "tool"]
            pid = json.loads(json.loads(first.content)["content"][0]["text"])["pid"]
            os.kill(pid, signal.SIGKILL)

    try:
        a = agent(
            "mcp-stdio-restart",
            [server],
            scripted.calls(scripted.call("crm-restart__whoami", {})),
            scripted.calls(scripted.call("crm-restart__whoami", {})),
        )
        a.model.on_request = kill_the_server_before_turn_two
        assert a.run("r-run", "who", store=store).answer == "done"
        pids = [
            json.loads(result_of(store, "r-run", c).get("result")["content"][0]["text"])["pid"]
            for c in ("call_1_1", "call_2_1")
        ]
        assert pids[0] != pids[1]
    finally:
        server.close()


def test_close_all_ends_the_stdio_servers_of_this_process(effects_file):
    server = stdio(effects_file, name="crm-close", trust_annotations=True)
    [whoami] = [t for t in server.load_tools() if t.remote == "whoami"]
    pid = json.loads(whoami()["content"][0]["text"])["pid"]
    da.mcp.close_all()  # what Celery's worker_shutdown and interpreter exit call
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the stdio server {pid} outlived close_all")


def test_calls_run_side_by_side_on_one_connection(store, http_server):
    tickets = http_server.server(name="tickets-par", trust_annotations=True)
    try:
        a = da.Agent(
            "mcp-parallel",
            ScriptedModel(
                [
                    scripted.calls(
                        scripted.call("tickets-par__slow", {"seconds": 2}),
                        scripted.call("tickets-par__slow", {"seconds": 2}),
                    ),
                    scripted.text("done"),
                ]
            ),
            "",
            [tickets],
            tool_concurrency=2,
        )
        _ = a.tools  # connected and listed first: the timing is the calls'
        started = time.monotonic()
        assert a.run("p-run", "both", store=store).answer == "done"
        assert time.monotonic() - started < 3.5  # both slept at once (one after the other: 4 s)
        for call in ("call_1_1", "call_1_2"):
            assert not result_of(store, "p-run", call).get("is_error")
    finally:
        tickets.close()
