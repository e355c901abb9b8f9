"""Live admin pages: the run page follows its run (``live.js`` on a Server-Sent Events view
of the admin's own, staff session), and the approval queue refreshes its rows when a call
is decided elsewhere (it polls ``pending_view``, a small JSON list). Without JavaScript the
pages are what they were: reload to see news."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    JsonResponse,
)

from ..database.reads import last_event_id, sse_response
from ..engine.follow import ends
from ..engine.ports import APPROVAL_PENDING
from ..models import ApprovalRequest, Run
from .base import AnyModelAdmin, object_gone


def run_events_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> Any:
    """The run's records and status changes after ``?after=`` (or ``Last-Event-ID``), as
    Server-Sent Events, for whoever may view the run. Unlike the API's stream it goes on
    through pauses (a person may approve elsewhere) and ends when the run ends."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    run = Run.objects.filter(pk=unquote(object_id)).only("run_id").first()
    if run is None:
        return object_gone(admin, request, object_id)
    if not admin.has_view_permission(request, run):
        raise PermissionDenied
    try:
        after = last_event_id(request, int(request.GET.get("after") or 0))
    except ValueError:
        return HttpResponseBadRequest("after and Last-Event-ID take the seq of a record")
    return sse_response(request, run.run_id, after, stop=ends)


def pending_view(admin: AnyModelAdmin, request: HttpRequest) -> HttpResponse:
    """The ids of the pending approval requests (the queue page compares them with its rows,
    and refreshes them when they differ). One query."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    if not admin.has_view_permission(request):
        raise PermissionDenied
    ids: list[Any] = list(
        ApprovalRequest.objects.filter(status=APPROVAL_PENDING)
        .order_by("pk")
        .values_list("pk", flat=True)[:1000]
    )
    return JsonResponse({"pending": ids})
