"""OpenTelemetry (issue 34, docs/telemetry.md) on PostgreSQL: spans asserted with the SDK's
in-memory exporter in this process, and with a JSON-lines exporter (tests/support/otel.py)
in the child processes that drive runs — a process killed with SIGKILL inside a tool call
and a new one resuming the run, and a real Celery worker driving a run started here and
approved here later. Metrics are read with the SDK's ``InMemoryMetricReader``.

Nothing of the journal, the store, the leases or Celery is mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import _state as celery_state
from django.core.checks import run_checks
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durable_agents as da
import durable_agents.tasks
from durable_agents import conf
from durable_agents import otel as wiring
from durable_agents.conf import parse
from durable_agents.database.store import DjangoStore
from durable_agents.engine import telemetry as hooks
from durable_agents.engine.commands.runs import create_run
from durable_agents.engine.journal import header
from durable_agents.engine.leases import HeldLease
from durable_agents.engine.ports import RunInfo
from durable_agents.engine.registry import get_agent
from durable_agents.models import Run, RunTrace
from tests.support.agents import count_effects, echo, gated, halting
from tests.support.otel import as_dict, read_spans
from tests.support.people import make_user
from tests.support.procs import ROOT, run_json, subprocess_env
from tests.support.webhook_post import post
from tests.support.workers import CeleryProcesses, CeleryTarget, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.timeout(180),
]


class Otel:
    """This process's telemetry, on SDK providers of the test's own."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[dict[str, Any]]:
        spans = [as_dict(s) for s in self.exporter.get_finished_spans()]
        return [s for s in spans if name is None or s["name"] == name]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        points.setdefault(metric.name, []).append(
                            (dict(point.attributes or {}), point.value)
                        )
        return points


@pytest.fixture
def otel() -> Iterator[Otel]:
    otel = Otel()
    wiring.enable(otel.tracer_provider, otel.meter_provider)
    try:
        yield otel
    finally:
        wiring.disable()
        otel.tracer_provider.shutdown()
        otel.meter_provider.shutdown()


def ids(span: Any) -> dict[str, str]:
    """The W3C ids of a live span of this process (as a link or a parent names them)."""
    ctx = span.get_span_context()
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


def linked(span: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A span's links by why (``durable_agents.link``)."""
    return {
        link["attributes"]["durable_agents.link"]: {
            "trace_id": link["trace_id"],
            "span_id": link["span_id"],
        }
        for link in span["links"]
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- (1) a run driven here -----------------------------------------------------------


def test_an_inline_run_has_a_drive_a_span_per_turn_and_per_call(otel):
    with otel.tracer.start_as_current_span("request") as request:
        assert echo.run("otel-inline", "where is order 7?").answer == "order 7 shipped"
    stored = RunTrace.objects.get(run_id="otel-inline")
    started = ids(request)
    assert stored.traceparent.startswith(f"00-{started['trace_id']}-{started['span_id']}-")
    [drive] = otel.spans("durable_agents.drive")
    assert drive["parent"] == started["span_id"] and drive["trace_id"] == started["trace_id"]
    assert linked(drive) == {"run.start": started}
    assert drive["attributes"] == {
        "durable_agents.run_id": "otel-inline",
        "durable_agents.agent": "echo",
        "gen_ai.agent.name": "echo",
        "durable_agents.outcome": "ok",
    }
    turns = otel.spans("durable_agents.model_turn")
    assert [t["attributes"]["durable_agents.turn"] for t in turns] == [1, 2]
    assert all(t["parent"] == drive["span_id"] for t in turns)
    assert [t["attributes"]["durable_agents.finish"] for t in turns] == ["tool_calls", "stop"]
    assert all("gen_ai.usage.input_tokens" in t["attributes"] for t in turns)
    [call] = otel.spans("durable_agents.tool_call")
    assert call["parent"] == drive["span_id"]
    assert call["attributes"] == {
        "durable_agents.run_id": "otel-inline",
        "durable_agents.call_id": "call_1_1",
        "durable_agents.tool": "lookup",
        "durable_agents.safety": "read_only",
        "durable_agents.attempt": 0,
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "call_1_1",
        "durable_agents.outcome": "ok",
    }
    assert {s["status"] for s in otel.spans()} == {"UNSET"}


def test_an_approval_later_is_a_drive_linked_to_the_start(otel):
    boss = make_user("boss", "approve_toolcall")
    with (
        otel.tracer.start_as_current_span("webhook") as webhook,
        pytest.raises(da.ApprovalPending),
    ):
        gated.run("otel-gated", "refund order 7")
    with otel.tracer.start_as_current_span("approver") as approver:
        # Inline dispatch (the test settings): the approval drives the run here, at once.
        da.approve("otel-gated", "call_1_1", approved=True, by=boss)
    first, second = otel.spans("durable_agents.drive")
    assert first["attributes"]["durable_agents.outcome"] == "paused"
    assert first["status"] == "UNSET"  # a pause is no error
    assert second["attributes"]["durable_agents.outcome"] == "ok"
    assert second["parent"] == ids(approver)["span_id"]
    assert linked(first) == linked(second) == {"run.start": ids(webhook)}
    [call] = otel.spans("durable_agents.tool_call")
    assert call["parent"] == second["span_id"]
    assert (
        call["attributes"]["durable_agents.safety"],
        call["attributes"]["durable_agents.attempt"],
    ) == ("side_effect", 1)


def test_a_webhook_delivery_is_the_start_of_its_turn(otel):
    with otel.tracer.start_as_current_span("POST /webhooks/inbound/") as request:
        response = post("otel-session", "delivery-1", "Where is order 7?")
    assert response.status_code == 202, response.content
    run_id = json.loads(response.content)["run_id"]
    drives = otel.spans("durable_agents.drive")
    assert drives and all(d["attributes"]["durable_agents.run_id"] == run_id for d in drives)
    assert all(linked(d) == {"run.start": ids(request)} for d in drives)
    assert RunTrace.objects.filter(run_id=run_id).exists()


def test_a_run_started_untraced_takes_its_first_drive_as_its_start(otel):
    assert echo.run("otel-untraced", "where is order 7?").answer == "order 7 shipped"
    [drive] = otel.spans("durable_agents.drive")
    assert drive["parent"] is None and linked(drive) == {}
    stored = RunTrace.objects.get(run_id="otel-untraced")
    assert stored.traceparent.startswith(f"00-{drive['trace_id']}-{drive['span_id']}-")


def test_a_failed_drive_is_an_error(otel):
    with otel.tracer.start_as_current_span("request") as request, pytest.raises(da.ConfigError):
        echo.run("otel-fail", None)  # no input to start from: config.input_missing
    [drive] = otel.spans("durable_agents.drive")
    assert (drive["status"], drive["attributes"]["durable_agents.outcome"]) == ("ERROR", "failed")
    assert drive["attributes"]["durable_agents.error"] == "config.input_missing"
    # The drive wrote the run's row itself (no start told of it): its caller is its start.
    assert linked(drive) == {"run.start": ids(request)}


# -- (2) off means off ---------------------------------------------------------------

OFF = """
import sys, django
django.setup()
from tests.support.otel import export_from_env
export_from_env()
from durable_agents.engine import telemetry
from tests.support.agents import echo
print(echo.run(sys.argv[1], "where is order 7?").answer)
print(type(telemetry.observer()).__name__)
print(",".join(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")))
"""


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_off_imports_nothing_of_opentelemetry(tmp_path, on):
    spans = tmp_path / "spans.jsonl"
    child_env = subprocess_env(**({"DA_OTEL_FILE": str(spans)} if on else {}))
    if not on:
        child_env.pop("DA_OTEL_FILE", None)
    run_id = new_id("otel-off" if not on else "otel-on")
    out = subprocess.run(
        [sys.executable, "-c", OFF, run_id],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    answer, observer, modules = [*out.stdout.splitlines(), "", ""][:3]
    assert answer == "order 7 shipped"
    if on:  # the control: the same child with telemetry on loads it and traces the drive
        assert observer == "OtelObserver" and "opentelemetry.trace" in modules.split(",")
        assert [s["name"] for s in read_spans(spans)][-1] == "durable_agents.drive"
    else:
        assert (observer, modules) == ("Observer", "")
        assert not RunTrace.objects.filter(run_id=run_id).exists()


# -- the setting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "installed", "says"),
    [
        ("yes", True, "DURABLE_AGENTS['TELEMETRY'] must be True or False"),
        (True, False, "pip install 'durable-agents[otel]'"),
    ],
)
def test_a_bad_telemetry_setting_is_a_system_check_error(
    settings, monkeypatch, value, installed, says
):
    monkeypatch.setattr(conf, "_otel_installed", lambda: installed)
    [problem] = parse({"TELEMETRY": value})[1]
    assert says in problem
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "TELEMETRY": value}
    [error] = [e for e in run_checks() if e.id == "durable_agents.E001"]
    assert says in error.msg


def test_telemetry_is_on_when_opentelemetry_is_installed():
    assert conf._otel_installed()
    assert parse({"TELEMETRY": True}) == (conf.Settings(telemetry=True), [])
    assert parse({})[0].telemetry is False


# -- (3) resumed in another process ---------------------------------------------------


@pytest.mark.slow
def test_a_run_killed_inside_a_tool_and_resumed_elsewhere_links_to_its_start(otel, tmp_path):
    spans = tmp_path / "spans.jsonl"
    run_id = new_id("otel-crash")
    agent = get_agent("crash-idempotent")
    with otel.tracer.start_as_current_span("webhook") as webhook:
        create_run(agent, "go", run_id, store=DjangoStore())  # what a start writes
    started = ids(webhook)
    code, _ = run_json(
        "tests.support.drive",
        agent.name,
        run_id,
        "go",
        DA_CRASH_INSIDE="call_1_2",
        DA_OTEL_FILE=str(spans),
    )
    assert code == -9
    killed = read_spans(spans)
    [killed_pid] = {s["pid"] for s in killed}
    # What the killed driver ended before it died: its turn and its first call. Its drive
    # never ended, so it was never exported.
    assert [(s["name"], s["attributes"].get("durable_agents.call_id")) for s in killed] == [
        ("durable_agents.model_turn", None),
        ("durable_agents.tool_call", "call_1_1"),
    ]
    code, out = run_json("tests.support.drive", agent.name, run_id, "go", DA_OTEL_FILE=str(spans))
    assert (code, out) == (0, {"status": "finished", "answer": "all done"})
    resumed = [s for s in read_spans(spans) if s["pid"] != killed_pid]
    [drive] = [s for s in resumed if s["name"] == "durable_agents.drive"]
    assert drive["pid"] != os.getpid() and drive["trace_id"] != started["trace_id"]
    assert linked(drive) == {"run.start": started}
    assert drive["attributes"]["durable_agents.outcome"] == "ok"
    calls = [
        (s["attributes"]["durable_agents.call_id"], s["attributes"]["durable_agents.safety"])
        for s in resumed
        if s["name"] == "durable_agents.tool_call"
    ]
    # The call killed in flight runs again (idempotent); the one recorded does not.
    assert calls == [("call_1_2", "idempotent"), ("call_2_1", "idempotent")]
    assert all(s["trace_id"] == drive["trace_id"] for s in resumed)
    assert count_effects(run_id) == {"call_1_1": 1, "call_1_2": 2, "call_2_1": 1}


# -- (3) a Celery worker, and an approval later ---------------------------------------


@pytest.fixture
def celery(settings, tmp_path: Path) -> Iterator[CeleryProcesses]:
    target = CeleryTarget.fresh(os.environ.get("PYTEST_XDIST_WORKER", "master"))
    settings.DURABLE_AGENTS = {
        **settings.DURABLE_AGENTS,
        "DISPATCH": "celery",
        "CELERY_QUEUE": target.queue,
    }
    previous = celery_state.get_current_app()
    app = target.app()
    procs = CeleryProcesses(target, tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()
        target.purge(app)
        target.clean()
        app.close()
        previous.set_current()


def _status(run_id: str, wanted: str) -> Run:
    def reached() -> Run | None:
        row = Run.objects.filter(run_id=run_id).first()
        return row if row is not None and row.status == wanted else None

    return wait_for(reached, 60, f"run {run_id} to be {wanted}")


@pytest.mark.slow
def test_a_celery_worker_links_its_drives_to_the_start_and_to_the_approver(otel, celery, tmp_path):
    spans = tmp_path / "worker-spans.jsonl"
    celery.worker(DA_OTEL_FILE=str(spans)).wait_ready()
    boss = make_user("boss", "approve_toolcall")
    with otel.tracer.start_as_current_span("webhook") as webhook:
        run_id = gated.start("refund order 7")
    _status(run_id, "awaiting_approval")
    with otel.tracer.start_as_current_span("approver") as approver:
        da.approve(run_id, "call_1_1", approved=True, by=boss)
    _status(run_id, "finished")

    def both_drives() -> list[dict[str, Any]] | None:
        drives = [s for s in read_spans(spans) if s["name"] == "durable_agents.drive"]
        return drives if len(drives) == 2 else None

    first, second = wait_for(both_drives, 30, "the worker's two drive spans")
    assert {first["pid"], second["pid"]} != {os.getpid()}
    assert first["attributes"]["durable_agents.outcome"] == "paused"
    # Handed over by the start itself: one link, the run's start.
    assert linked(first) == {"run.start": ids(webhook)}
    assert second["attributes"]["durable_agents.outcome"] == "ok"
    assert linked(second) == {"run.start": ids(webhook), "handed_over": ids(approver)}
    [call] = [s for s in read_spans(spans) if s["name"] == "durable_agents.tool_call"]
    assert call["parent"] == second["span_id"]
    assert call["attributes"]["durable_agents.tool"] == "refund"


# -- (4) metrics -----------------------------------------------------------------------


def _value(points: list[tuple[dict[str, Any], Any]], **attributes: Any) -> Any:
    [value] = [v for a, v in points if a == attributes]
    return value


def test_metrics_count_what_waits_on_people_and_takeovers(otel, monkeypatch):
    with pytest.raises(da.ApprovalPending):
        gated.run("otel-m-gated", "refund order 7")
    with pytest.raises(da.OutcomeUnknown):
        halting.run("otel-m-halted", "charge")
    store = DjangoStore()
    store.create_run(RunInfo("otel-m-queued", agent="echo", input="where is order 7?"))
    points = otel.metrics()
    runs = points["durable_agents.runs"]
    assert _value(runs, **{"durable_agents.status": "awaiting_approval"}) == 1
    assert _value(runs, **{"durable_agents.status": "halted"}) == 1
    assert _value(runs, **{"durable_agents.status": "queued"}) == 1
    assert _value(runs, **{"durable_agents.status": "running"}) == 0
    assert {a["durable_agents.status"] for a, _ in runs} >= {"sleeping", "awaiting_input"}
    assert _value(points["durable_agents.approvals.waiting"]) == 1
    assert 0 <= _value(points["durable_agents.approvals.oldest_age"]) < 60
    assert _value(points["durable_agents.halts.open"]) == 1
    assert "durable_agents.takeovers" not in points

    # A backlog past the cap reads as the cap: a collection stays a bounded read.
    store.create_run(RunInfo("otel-m-queued-2", agent="echo", input="where is order 7?"))
    monkeypatch.setattr(wiring, "COUNT_CAP", 1)
    points = otel.metrics()
    assert _value(points["durable_agents.runs"], **{"durable_agents.status": "queued"}) == 1
    monkeypatch.undo()
    points = otel.metrics()
    assert _value(points["durable_agents.runs"], **{"durable_agents.status": "queued"}) == 2

    # A driver that died holding a lease: the next one takes the run over.
    store.insert("otel-m-queued", *header())
    assert store.acquire_lease("otel-m-queued", "worker-dead@host:41", "dead-token", 1)

    def taken() -> HeldLease | None:
        try:
            return HeldLease(store, "otel-m-queued", 30).acquire()
        except da.RunBusy:
            return None

    wait_for(taken, 10, "the dead driver's lease to be taken over").release()
    [(attributes, count)] = otel.metrics()["durable_agents.takeovers"]
    assert count == 1 and attributes["durable_agents.reason"] in ("expired", "holder gone")


def test_no_telemetry_no_row(otel):
    wiring.disable()
    assert type(hooks.observer()) is hooks.Observer
    assert echo.run("otel-disabled", "where is order 7?").answer == "order 7 shipped"
    assert otel.spans() == []
    assert not RunTrace.objects.filter(run_id="otel-disabled").exists()
    assert json.dumps(wiring.handover_headers()) == "{}"
