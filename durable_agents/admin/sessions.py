"""Sessions in the admin: a list of sessions and a session's page (its transcript and turns).

A session is not a row of its own: it is the runs that share a ``session_id`` (one per turn,
``<session>>turn/<n>`` or ``<session>>event/<key>``) plus the session's journal
(``<session>>session``), whose ``answer:`` records are the transcript. Read-only.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Max, Min, Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from ..database import reads
from ..engine.errors import DurableAgentsError
from ..engine.session_log import SessionLog
from ..engine.views import SESSION_JOURNAL_SUFFIX, Record, session_journal
from ..models import Run
from .base import AnyModelAdmin, admin_url, page, run_url

SESSIONS_PER_PAGE = 100
JOURNAL_SUFFIX = SESSION_JOURNAL_SUFFIX


def _check(admin: AnyModelAdmin, request: HttpRequest) -> None:
    if not admin.has_view_permission(request):
        raise PermissionDenied


def sessions_view(admin: AnyModelAdmin, request: HttpRequest) -> HttpResponse:
    """Distinct session ids with their turn counts and last activity: two queries a page
    (the count and the page), whatever the page size."""
    _check(admin, request)
    query = str(request.GET.get("q") or "").strip()
    rows = Run.objects.filter(session_id__isnull=False)
    if query:
        rows = rows.filter(session_id__icontains=query)
    turn = ~Q(run_id__endswith=JOURNAL_SUFFIX)  # the session's own journal is not a turn
    grouped = (
        rows.values("session_id")
        .annotate(
            agent=Max("agent"),
            turns=Count("run_id", filter=turn),
            open_turns=Count("run_id", filter=turn & Q(finished_at__isnull=True)),
            started=Min("created_at"),
            last_activity=Max("updated_at"),
        )
        .order_by("-last_activity", "session_id")
    )
    page_obj = Paginator(grouped, SESSIONS_PER_PAGE).get_page(request.GET.get("p"))
    sessions = [
        {**row, "url": admin_url(admin, "session", quote(str(row["session_id"])))}
        for row in page_obj.object_list
    ]
    return page(
        admin,
        request,
        "admin/durable_agents/run/sessions.html",
        "Sessions",
        {"sessions": sessions, "page_obj": page_obj, "query": query},
    )


def _transcript(
    admin: AnyModelAdmin, records: list[Record], status: dict[str, str]
) -> list[dict[str, Any]]:
    """The closed turns in the order they closed (a turn that did not finish says so), then
    the messages still waiting."""
    log = SessionLog.of(records)
    closed = [(t.run_id, t.input, t.reply, t.at) for t in log.closed]
    waiting = [(s.run_id, s.input, None, s.at) for s in log.waiting()]
    return [
        {
            "input": message,
            "answer": reply,
            "run_id": run_id,
            "url": run_url(admin, run_id),
            "status": status.get(run_id, "not started"),
            "at": at,
        }
        for run_id, message, reply, at in [*closed, *waiting]
    ]


def session_view(admin: AnyModelAdmin, request: HttpRequest, session_id: str) -> HttpResponse:
    """The session's transcript (from its journal) and its turn runs: two queries."""
    _check(admin, request)
    sid = unquote(session_id)
    journal_id = session_journal(sid)
    turns = list(
        Run.objects.filter(session_id=sid)
        .exclude(run_id=journal_id)
        .order_by("created_at", "run_id")
        .only("run_id", "agent", "status", "turns", "answer", "created_at", "updated_at")
    )
    error = None
    try:
        records = reads.journal(journal_id)
    except DurableAgentsError as exc:
        records, error = [], f"The session's journal cannot be read: {exc} [{exc.code}]"
    if not turns and not records and error is None:
        messages.warning(request, f"There is no session {sid!r}. Perhaps its runs were deleted?")
        return HttpResponseRedirect(admin_url(admin, "sessions"))
    status = {t.run_id: t.status for t in turns}
    return page(
        admin,
        request,
        "admin/durable_agents/run/session.html",
        f"Session {sid}",
        {
            "session_id": sid,
            "agent": turns[0].agent if turns else "",
            "journal_url": run_url(admin, journal_id),
            "sessions_url": admin_url(admin, "sessions"),
            "transcript": _transcript(admin, records, status),
            "turns": [{"run": t, "url": run_url(admin, t.run_id)} for t in turns],
            "error": error,
        },
    )
