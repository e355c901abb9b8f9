"""OpenTelemetry for durable_agents: spans for each drive of a run, each model turn and each
tool call, linked to where the run was started; metrics on runs, approvals, halts and
takeovers (docs/telemetry.md).

On with ``DURABLE_AGENTS["TELEMETRY"] = True`` (read when the app is ready). Importing this
module imports nothing of OpenTelemetry: only ``enable`` does, so with telemetry off a
process never loads it and the engine's hooks stay its do-nothing defaults.

Linking: when a run is created, the current span's W3C trace context is stored with it
(``RunTrace``); every drive span of the run, in whatever process and however much later,
carries a span link to it (``durable_agents.link = "run.start"``). A run handed to a Celery
worker also carries the context of whoever handed it over (a start, an approval, an answer,
a resume) in a message header; the drive links to that too (``"handed_over"``). A drive
span's parent is whatever span is current where it runs (the caller of an inline drive;
Celery's own span if the site instruments Celery), else it begins a trace of its own.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from .engine import ports
from .engine import telemetry as hooks

# The logger keeps the module's old name: sites name it in LOGGING.
log = logging.getLogger("durable_agents.telemetry")

SCOPE = "durable_agents"
# The Celery message header carrying the hand-over's trace context.
HEADER = "durable_agents_traceparent"
# Gauges count at most this many rows each: a count over a backlog larger than this says
# "at least" (docs/telemetry.md), and a collection stays a bounded index read.
COUNT_CAP = 10_000

# The trace context of whoever handed the run being driven in this context over (set by
# the Celery task from its message header).
_handed_over: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "durable_agents_handed_over", default=None
)
_enabled = False

# Span attribute names for what the engine sets on a span.
_NAMES = {
    "outcome": "durable_agents.outcome",
    "error": "durable_agents.error",
    "finish": "durable_agents.finish",
    "model": "gen_ai.response.model",
}


def enabled() -> bool:
    return _enabled


def enable(tracer_provider: Any = None, meter_provider: Any = None) -> OtelObserver:
    """Install the OpenTelemetry observer in this process (the global providers unless
    given) and register the metrics. The Django app calls it when ``TELEMETRY`` is on."""
    global _enabled
    observer = OtelObserver(tracer_provider, meter_provider)
    hooks.install(observer)
    _enabled = True
    return observer


def disable() -> None:
    """Back to the engine's do-nothing hooks (metrics already registered stay so)."""
    global _enabled
    hooks.install(None)
    _enabled = False


def handover_headers() -> dict[str, str]:
    """Celery message headers carrying the current trace context (none when off, or when
    no span is current)."""
    if not _enabled:
        return {}
    parent = _current_traceparent()
    return {HEADER: parent} if parent else {}


@contextmanager
def handed_over(traceparent: str | None) -> Iterator[None]:
    """Drive inside this block as handed over from ``traceparent`` (a message header)."""
    if not traceparent:
        yield
        return
    token = _handed_over.set(traceparent)
    try:
        yield
    finally:
        _handed_over.reset(token)


def _current_traceparent() -> str | None:
    from opentelemetry import trace

    return _format(trace.get_current_span().get_span_context())


def _format(ctx: Any) -> str | None:
    """``traceparent`` of a span context (W3C: version-trace-span-flags), None if invalid."""
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _parse(traceparent: str, tracestate: str = "") -> Any:
    """The remote span context a stored ``traceparent`` names (None if it is malformed)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ctx = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier))
    span_context = ctx.get_span_context()
    return span_context if span_context.is_valid else None


class _Span(hooks.Span):
    __slots__ = ("error", "outcome", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.outcome: str | None = None
        self.error = ""

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is None or value == "":
                continue
            if key == "usage":
                self.span.set_attribute("gen_ai.usage.input_tokens", value.input_tokens)
                self.span.set_attribute("gen_ai.usage.output_tokens", value.output_tokens)
                continue
            if key == "outcome":
                self.outcome = str(value)
            if key == "error":
                self.error = str(value)
            self.span.set_attribute(_NAMES.get(key, f"durable_agents.{key}"), value)

    def ended(self, exc: BaseException | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if exc is not None:
            self.set(outcome=hooks.outcome_of(exc), error=hooks.error_name(exc))
        elif self.outcome is None:
            self.set(outcome=hooks.OK)
        # A pause, a busy run or a lost lease is how durable execution works, not an error.
        if self.outcome in (hooks.FAILED, hooks.ERROR):
            self.span.set_status(Status(StatusCode.ERROR, self.error))


class OtelObserver(hooks.Observer):
    """The engine's hooks on OpenTelemetry: spans on a tracer, a takeover counter and
    gauges read from the database at collection time."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import metrics, trace

        from . import __version__

        self.tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        self.takeovers = meter.create_counter(
            "durable_agents.takeovers",
            unit="{takeover}",
            description="leases taken over from a driver that died or expired",
        )
        meter.create_observable_gauge(
            "durable_agents.runs",
            callbacks=[_runs_by_status],
            unit="{run}",
            description=f"unfinished runs by status (each count capped at {COUNT_CAP})",
        )
        meter.create_observable_gauge(
            "durable_agents.approvals.waiting",
            callbacks=[_approvals_waiting],
            unit="{call}",
            description=f"tool calls awaiting approval (capped at {COUNT_CAP})",
        )
        meter.create_observable_gauge(
            "durable_agents.approvals.oldest_age",
            callbacks=[_oldest_approval_age],
            unit="s",
            description="how long the oldest tool call awaiting approval has waited",
        )
        meter.create_observable_gauge(
            "durable_agents.halts.open",
            callbacks=[_halts_open],
            unit="{halt}",
            description=f"open halts: outcomes a person must record (capped at {COUNT_CAP})",
        )

    @contextmanager
    def _span(self, name: str, attributes: dict[str, Any], links: Any = ()) -> Iterator[_Span]:
        with self.tracer.start_as_current_span(
            name,
            attributes=attributes,
            links=list(links),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            handle = _Span(span)
            try:
                yield handle
            except BaseException as exc:
                handle.ended(exc)
                raise
            handle.ended(None)

    def drive(self, run_id: str, agent: str) -> Any:
        return self._drive(run_id, agent)

    @contextmanager
    def _drive(self, run_id: str, agent: str) -> Iterator[_Span]:
        attributes = {
            "durable_agents.run_id": run_id,
            "durable_agents.agent": agent,
            "gen_ai.agent.name": agent,
        }
        started = _stored(run_id)
        if started is None:
            # Created where nothing was traced, or by a path that tells no start (a fork, a
            # row the drive itself wrote): who handed it over, else the caller, is its start.
            origin = _handed_over.get() or _current_traceparent()
            if origin:
                _store(run_id, origin)
                started = (origin, "")
        with self._span("durable_agents.drive", attributes, self._links(started)) as span:
            if started is None:  # nothing traced at all: this first drive is its start
                _store(run_id, _format(span.span.get_span_context()))
            yield span

    def _links(self, started: tuple[str, str] | None) -> Iterable[Any]:
        from opentelemetry.trace import Link

        seen = set()
        for traceparent, tracestate, why in (
            (*(started or ("", "")), "run.start"),
            (_handed_over.get() or "", "", "handed_over"),
        ):
            if not traceparent or traceparent in seen:
                continue
            seen.add(traceparent)
            context = _parse(traceparent, tracestate)
            if context is not None:
                yield Link(context, {"durable_agents.link": why})

    def model_turn(self, run_id: str, n: int) -> Any:
        attributes = {"durable_agents.run_id": run_id, "durable_agents.turn": n}
        return self._span("durable_agents.model_turn", attributes)

    def tool_call(self, run_id: str, call_id: str, tool: str, safety: str, attempt: int) -> Any:
        attributes = {
            "durable_agents.run_id": run_id,
            "durable_agents.call_id": call_id,
            "durable_agents.tool": tool,
            "durable_agents.safety": safety,
            "durable_agents.attempt": attempt,
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
        }
        return self._span("durable_agents.tool_call", attributes)

    def run_created(self, run_id: str) -> None:
        _store(run_id, _current_traceparent())

    def takeover(self, run_id: str, reason: str) -> None:
        self.takeovers.add(1, {"durable_agents.reason": reason})


# -- the run's start, stored ----------------------------------------------------------


def _database() -> str:
    from .conf import get_settings

    return get_settings().database


def _stored(run_id: str) -> tuple[str, str] | None:
    from django.db import DatabaseError

    from .models import RunTrace

    try:
        row = (
            RunTrace.objects.using(_database())
            .filter(run_id=run_id)
            .values_list("traceparent", "tracestate")
            .first()
        )
    except DatabaseError:  # telemetry never stops a drive
        log.warning("could not read the trace context of run %s", run_id, exc_info=True)
        return None
    return (row[0], row[1]) if row is not None else None


def _store(run_id: str, traceparent: str | None) -> None:
    """Remember ``traceparent`` as where ``run_id`` started; the first one stored stays."""
    if not traceparent:
        return
    from django.db import DatabaseError, transaction

    from .models import RunTrace

    using = _database()
    try:
        # A savepoint: inside the caller's transaction (a start in ``atomic``), a failed
        # insert must not break it.
        with transaction.atomic(using=using):
            RunTrace.objects.using(using).bulk_create(
                [RunTrace(run_id=run_id, traceparent=traceparent)], ignore_conflicts=True
            )
    except DatabaseError:
        log.warning("could not store the trace context of run %s", run_id, exc_info=True)


# -- metrics, read at collection time ------------------------------------------------


@contextmanager
def _reading() -> Iterator[None]:
    """A gauge's read. It runs on the thread collecting metrics (an exporter's, or a
    request's serving ``/metrics``), on that thread's connection, left open between
    collections. A failed read reports nothing this time instead of raising into the
    exporter; a broken connection is closed (unless a transaction holds it), so the next
    collection connects again."""
    from django.db import DatabaseError, connections

    try:
        yield
    except DatabaseError:
        log.warning("durable_agents metrics: the database read failed", exc_info=True)
        connection = connections[_database()]
        if not connection.in_atomic_block:
            connection.close()


def _capped(queryset: Any) -> int:
    return int(queryset.values("pk")[:COUNT_CAP].count())


def _runs_by_status(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    from .models import Run

    with _reading():
        runs = Run.objects.using(_database())
        # One capped read per unfinished status, on the (status, created_at) index; every
        # status is reported, so a series drops to 0 rather than vanishing.
        return [
            Observation(_capped(runs.filter(status=status)), {"durable_agents.status": status})
            for status in ports.NOT_TERMINAL_STATUSES
        ]
    return []


def _pending_approvals() -> Any:
    from .models import ApprovalRequest

    return ApprovalRequest.objects.using(_database()).filter(status=ports.APPROVAL_PENDING)


def _approvals_waiting(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    with _reading():
        return [Observation(_capped(_pending_approvals()))]
    return []


def _oldest_approval_age(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    with _reading():
        oldest = (
            _pending_approvals().order_by("created_at").values_list("created_at", flat=True)
        ).first()
        age = 0.0 if oldest is None else (datetime.now(UTC) - oldest).total_seconds()
        return [Observation(max(age, 0.0))]
    return []


def _halts_open(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    from .models import Halt

    with _reading():
        open_halts = Halt.objects.using(_database()).filter(status=ports.HALT_OPEN)
        return [Observation(_capped(open_halts))]
    return []
