"""The admin's own pages and POST handlers for runs (the run page, resume, cancel) and the
helpers the other admin modules' handlers share. The approval and halt pages live in
``admin_queues``; the journal timeline in ``admin_timeline``; fork, compare and sessions in
``admin_history`` and ``admin_sessions``.

Glue only: every change goes through an engine command (``approve``, ``resolve_halt``,
``cancel``, ``hand_over``), which also writes the action log; nothing here sets a status.
Each handler checks its own permission, so a POST made without the button is refused the
same way. A hand-over to a
driver that fails (the Celery broker is down) is a warning, not a 500: what staff decided is
recorded by then, and the page says how the run gets going again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from . import permissions
from .admin_timeline import agent_drift, build_timeline
from .engine.commands.runs import cancel, hand_over
from .engine.errors import DurableAgentsError
from .engine.identity import Actor
from .engine.journal import Journal
from .engine.ports import QUEUED, RUNNING, TERMINAL_STATUSES
from .engine.records import Record
from .models import ActionLog
from .people import actor_of
from .storage import DjangoStore

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

ADMIN = "admin"  # the channel history rows record for what staff do here

log = logging.getLogger("durable_agents.admin")

# What gets a run whose hand-over failed going again. Beat recovery re-enqueues runs that
# are queued or running (a decided or resolved run is queued first), not ones paused on a
# person.
BY_RECOVERY = "beat recovery hands it to a worker on its next pass"
BY_RESUME = "press Resume on the run page once workers are reachable again"


def admin_actor(request: HttpRequest) -> Actor:
    """The signed-in user as the engine's ``Actor``, acting through the admin."""
    return actor_of(request.user, ADMIN)


def allows(request: HttpRequest, action: str) -> bool:
    """May this user do ``action`` (``durable_agents.permissions``, the API's table too)?"""
    return permissions.allows(request.user, action)


def admin_url(admin: ModelAdmin[Any], name: str, *args: Any) -> str:
    opts = admin.model._meta
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_{name}",
        args=args,
        current_app=admin.admin_site.name,
    )


def run_url(admin: ModelAdmin[Any], run_id: str) -> str:
    return reverse(
        "admin:durable_agents_run_change", args=[quote(run_id)], current_app=admin.admin_site.name
    )


def _post_only(request: HttpRequest) -> HttpResponse | None:
    return None if request.method == "POST" else HttpResponseNotAllowed(["POST"])


def _require(request: HttpRequest, action: str) -> None:
    if not allows(request, action):
        raise PermissionDenied


def _missing(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    opts = admin.model._meta
    messages.warning(
        request,
        f"{opts.verbose_name} with ID {object_id!r} does not exist. Perhaps it was deleted?",
    )
    return HttpResponseRedirect(admin_url(admin, "changelist"))


def _posted_object(
    admin: ModelAdmin[Any], request: HttpRequest, object_id: str, action: str
) -> Any:
    """The object a command's POST acts on, or the response that refuses the request (not a
    POST, or the object is gone); without the permission ``action`` needs, PermissionDenied."""
    if (refusal := _post_only(request)) is not None:
        return refusal
    _require(request, action)
    obj = admin.get_object(request, unquote(object_id))
    return _missing(admin, request, object_id) if obj is None else obj


def _not_handed_over(request: HttpRequest, recorded: str, exc: Exception, then: str) -> None:
    log.warning("%s, but handing the run to a driver failed", recorded, exc_info=exc)
    messages.warning(
        request,
        f"{recorded}, but the run could not be handed to a worker now "
        f"({type(exc).__name__}: {exc}); {then}.",
    )


def run_context(admin: ModelAdmin[Any], request: HttpRequest, run: Any) -> dict[str, Any]:
    """Everything the run page shows beyond its fields (lineage: ``admin_history``)."""
    store = DjangoStore()
    timeline_error = None
    records: list[Record] = []
    try:
        records = Journal(store).records(run.run_id)
    except DurableAgentsError as exc:
        timeline_error = str(exc)
    can_fork = allows(request, "fork") and bool(records)
    approvals = [
        {"obj": a, "url": reverse("admin:durable_agents_approvalrequest_change", args=[a.pk])}
        for a in run.approval_requests.order_by("created_at")
    ]
    halts = [
        {"obj": h, "url": reverse("admin:durable_agents_halt_change", args=[h.pk])}
        for h in run.halts.order_by("created_at")
    ]
    return {
        "timeline": build_timeline(records),
        "timeline_error": timeline_error,
        **agent_drift(records, fallback=run.fingerprint),
        "fork_url": admin_url(admin, "fork", quote(run.run_id)) if can_fork else None,
        "lease": store.get_lease(run.run_id),
        "action_log": [
            {"row": a, "payload": json.dumps(a.payload, ensure_ascii=False, default=str)}
            for a in ActionLog.objects.filter(run_id=run.run_id)[:200]
        ],
        "run_approvals": approvals,
        "run_halts": halts,
        "can_operate": allows(request, "cancel"),
        "run_finished": run.status in TERMINAL_STATUSES,
        "resume_url": admin_url(admin, "resume", quote(run.run_id)),
        "cancel_url": admin_url(admin, "cancel", quote(run.run_id)),
    }


# -- resume and cancel ------------------------------------------------------------------


def resume_runs(request: HttpRequest, run_ids: Iterable[str]) -> tuple[list[str], list[str]]:
    """Hand unfinished runs to a driver (the engine's ``hand_over``, which logs each);
    returns (resumed, refused)."""
    store = DjangoStore()
    resumed, refused = [], []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None or run.status in TERMINAL_STATUSES:
            refused.append(f"{run_id} ({'deleted' if run is None else run.status})")
            continue
        try:
            hand_over(run_id, by=admin_actor(request), via="admin", store=store)
        except DurableAgentsError as exc:  # its state moved on since it was read
            refused.append(f"{run_id}: {exc}")
            continue
        except Exception as exc:  # logged; only the hand-over failed: the broker is unreachable
            then = BY_RECOVERY if run.status in (QUEUED, RUNNING) else BY_RESUME
            _not_handed_over(request, f"The resume of run {run_id} is logged", exc, then)
            continue
        resumed.append(run_id)
    return resumed, refused


def cancel_runs(
    request: HttpRequest, run_ids: Iterable[str], reason: str
) -> tuple[list[str], list[str]]:
    done, refused = [], []
    for run_id in run_ids:
        try:
            cancel(run_id, by=admin_actor(request), reason=reason)
        except DurableAgentsError as exc:
            refused.append(f"{run_id}: {exc}")
        else:
            done.append(run_id)
    return done, refused


def report(request: HttpRequest, verb: str, done: list[str], refused: list[str]) -> None:
    if done:
        messages.success(request, f"{verb}: {', '.join(done)}")
    for why in refused:
        messages.error(request, f"Not {verb.lower()}: {why}")


def run_resume_view(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    run = _posted_object(admin, request, object_id, "resume")
    if isinstance(run, HttpResponse):
        return run
    done, refused = resume_runs(request, [run.run_id])
    report(request, "Handed to a driver", done, refused)
    return HttpResponseRedirect(run_url(admin, run.run_id))


def run_cancel_view(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    run = _posted_object(admin, request, object_id, "cancel")
    if isinstance(run, HttpResponse):
        return run
    reason = str(request.POST.get("reason") or "").strip()[:1000]
    done, refused = cancel_runs(request, [run.run_id], reason or "cancelled in the admin")
    report(request, "Cancelled", done, refused)
    return HttpResponseRedirect(run_url(admin, run.run_id))


# -- pages and forms of the other admins ------------------------------------------


def page(
    admin: ModelAdmin[Any],
    request: HttpRequest,
    template: str,
    title: str,
    context: dict[str, Any],
    status: int = 200,
) -> TemplateResponse:
    """An admin page of ``admin``'s model, outside the change form."""
    opts = admin.model._meta
    request.current_app = admin.admin_site.name
    return TemplateResponse(
        request,
        template,
        {
            **admin.admin_site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "title": title,
            "subtitle": None,
            "changelist_url": admin_url(admin, "changelist"),
            **context,
        },
        status=status,
    )


def json_field(value: str, label: str) -> Any:
    """Parse a form's JSON text; NaN and Infinity are refused (they are not JSON)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(value, parse_constant=refuse)
    except ValueError as exc:
        raise forms.ValidationError(f"{label} is not valid JSON: {exc}") from None
