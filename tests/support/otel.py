"""OpenTelemetry in tests: spans a child process exports to a file the test reads.

``DA_OTEL_FILE=<path>`` turns ``DURABLE_AGENTS["TELEMETRY"]`` on in a child (tests/settings.py),
and ``export_from_env()`` (called by the child's entry point: tests/celery_app.py,
tests/support/drive.py) sends every span it ends, synchronously, as one JSON line appended
to that file: a child killed with SIGKILL has written every span it ended before. Without
the variable nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ENV = "DA_OTEL_FILE"


def export_from_env() -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource({"process.pid": os.getpid()}))
    provider.add_span_processor(SimpleSpanProcessor(_jsonlines_exporter(path)))
    trace.set_tracer_provider(provider)


def _jsonlines_exporter(path: str) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLines(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            with open(path, "a", encoding="utf-8") as out:
                for span in spans:
                    out.write(json.dumps(as_dict(span)) + "\n")
            return SpanExportResult.SUCCESS

    return JsonLines()


def as_dict(span: Any) -> dict[str, Any]:
    """A finished SDK span as plain data: ids as W3C hex, links, attributes, status."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "status": span.status.status_code.name,
        "pid": (span.resource.attributes or {}).get("process.pid"),
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
