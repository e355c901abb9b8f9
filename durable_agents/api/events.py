"""A run's journal live, as Server-Sent Events (``durable_agents.database.events``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponseBase
from ninja import Router

from ..database.reads import last_event_id, sse_response
from ..engine.commands.runs import get_run
from .auth import check
from .errors import ApiError
from .schemas import ERRORS, After, checked_run_id

router = Router(tags=["runs"])

_STREAM = {
    "responses": {
        "200": {
            "description": "Server-Sent Events: `record` (id = seq), `status`, `end`",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    }
}


@router.get(
    "/runs/{path:run_id}/events",
    response=ERRORS,
    openapi_extra=_STREAM,
)
def run_events(request: HttpRequest, run_id: str, after: After = 0) -> HttpResponseBase:
    """The run's journal records as they are committed, as Server-Sent Events (needs what
    reading the journal needs). Each ``record`` event has the record's seq as its id; a
    client reconnecting with ``Last-Event-ID`` (or ``?after=``) gets only later ones. A
    ``status`` event comes first and on every change; the stream ends with an ``end`` event
    when the run ends or pauses, and sends a ``: keep-alive`` comment every 15 s."""
    check(request, "view_runs")
    run = get_run(checked_run_id(run_id))
    try:
        start = last_event_id(request, after)
    except ValueError:
        raise ApiError(
            422,
            "request.invalid",
            "Last-Event-ID must be the seq of a record (a whole number, 0 or more)",
        ) from None
    return sse_response(request, run.run_id, start)
