"""The staff admin: runs and their journal timeline, and the action history (the approval
and halt queues: ``admin_queues``; keys: ``admin_keys``; fork and compare: ``admin_history``;
sessions: ``admin_sessions``; the shared base: ``admin_base``).

Every page is read-only: staff change runs only through engine commands (approve, deny,
resolve, cancel, resume), each behind its own permission and each written to ActionLog.
List pages annotate what they show, so they cost the same number of queries whatever the
page size. See docs/admin.md.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import URLPattern

from . import (
    admin_health,
    admin_keys,  # noqa: F401  (registers the API key and approver key admins)
    admin_queues,  # noqa: F401  (registers the approval and halt queues)
)
from . import admin_history as history
from . import admin_sessions as sessions
from . import admin_views as views
from .admin_base import _count, _json_cell, _ModelAdmin, _ReadOnly
from .engine.identity import logged
from .engine.ports import APPROVAL_PENDING, HALT_OPEN
from .models import ActionLog, ApprovalRequest, Halt, JournalEntry, Lease, Run
from .storage import DjangoStore

# -- runs ---------------------------------------------------------------------------------


@admin.register(Run)
class RunAdmin(_ReadOnly):
    list_display = (
        "run_id",
        "agent",
        "status",
        "turns",
        "pending_approvals",
        "open_halts",
        "updated_at",
    )
    list_filter = ("status", "agent")
    search_fields = ("run_id", "session_id")
    actions = ["resume_selected", "cancel_selected"]
    change_form_template = "admin/durable_agents/run/change_form.html"
    change_list_template = "admin/durable_agents/run/change_list.html"
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "run_id",
                    "agent",
                    "status",
                    "session_id",
                    "turns",
                    "answer",
                    "input_pretty",
                    "attempts",
                    "last_error_pretty",
                ]
            },
        ),
        ("Cost", {"fields": ["usage_pretty", "spend_pretty"]}),
        (
            "Lineage",
            {
                "classes": ["collapse"],
                "fields": [
                    "parent_run_id",
                    "root_run_id",
                    "forked_from",
                    "forked_step",
                    "fingerprint_pretty",
                ],
            },
        ),
        ("Times", {"fields": ["created_at", "updated_at", "finished_at", "dispatched_at"]}),
    ]
    readonly_fields = [str(f) for _, group in fieldsets for f in group["fields"]]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        rows: QuerySet[Run] = (
            super()
            .get_queryset(request)
            .annotate(
                n_pending_approvals=_count(ApprovalRequest, "run", status=APPROVAL_PENDING),
                n_open_halts=_count(Halt, "run", status=HALT_OPEN),
            )
        )
        return rows

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or views.allows(request, "view_runs")

    def has_module_permission(self, request: HttpRequest) -> bool:
        allowed = super().has_module_permission(request)
        if allowed and self.has_view_permission(request):
            admin_health.warn_on_index(request)  # staff who see runs see queue health
        return allowed

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _ModelAdmin.has_delete_permission(self, request, obj)

    def has_cancel_run_permission(self, request: HttpRequest) -> bool:
        return views.allows(request, "cancel")

    def get_urls(self) -> list[URLPattern]:
        # The admin's "<object_id>/" (a redirect to the change page) would swallow
        # "compare/" and "sessions/<id>/", so those go before it. A run's own pages
        # ("<object_id>/change/" …) go before the session page, so a run named "sessions"
        # still opens; a session named "change" (or "history", "delete", "resume", "cancel",
        # "fork") has no page of its own.
        own = super().get_urls()
        catch_all = [u for u in own if str(u.pattern) == "<path:object_id>/"]
        return [
            self._url("compare", history.compare_view, "compare/"),
            self._url("sessions", sessions.sessions_view, "sessions/"),
            self._url("resume", views.run_resume_view),
            self._url("cancel", views.run_cancel_view),
            self._url("fork", history.fork_view),
            *[u for u in own if u not in catch_all],
            self._url("session", sessions.session_view, "sessions/<str:session_id>/"),
            *catch_all,
        ]

    @admin.display(description="pending approvals", ordering="n_pending_approvals")
    def pending_approvals(self, obj: Any) -> int:
        return int(obj.n_pending_approvals)

    @admin.display(description="open halts", ordering="n_open_halts")
    def open_halts(self, obj: Any) -> int:
        return int(obj.n_open_halts)

    @admin.display(description="input")
    def input_pretty(self, obj: Run) -> str:
        return _json_cell(obj.input)

    @admin.display(description="last error")
    def last_error_pretty(self, obj: Run) -> str:
        return _json_cell(obj.last_error) if obj.last_error else "-"

    @admin.display(description="usage")
    def usage_pretty(self, obj: Run) -> str:
        return _json_cell(obj.usage)

    @admin.display(description="spend")
    def spend_pretty(self, obj: Run) -> str:
        return _json_cell(obj.spend)

    @admin.display(description="fingerprint")
    def fingerprint_pretty(self, obj: Run) -> str:
        return _json_cell(obj.fingerprint)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            context.update(views.run_context(self, request, obj))
            context.update(history.lineage(self, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.action(description="Resume selected runs", permissions=["cancel_run"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        ids = list(queryset.values_list("run_id", flat=True))
        done, refused = views.resume_runs(request, ids)
        views.report(request, "Handed to a driver", done, refused)

    @admin.action(description="Cancel selected runs", permissions=["cancel_run"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        ids = list(queryset.values_list("run_id", flat=True))
        done, refused = views.cancel_runs(request, ids, "cancelled in the admin")
        views.report(request, "Cancelled", done, refused)

    # Deleting a run removes its journal, lease, approvals and halts; the ActionLog row,
    # written in the same transaction as the delete, stays (it is keyed by run id only).

    def delete_model(self, request: HttpRequest, obj: Run) -> None:
        self._log_deletes(request, [obj])
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._log_deletes(request, list(queryset))
        super().delete_queryset(request, queryset)

    def _log_deletes(self, request: HttpRequest, runs: list[Run]) -> None:
        store = DjangoStore()
        who = views.admin_actor(request)
        for run in runs:
            store.log_action(
                logged(
                    who,
                    "delete",
                    run.run_id,
                    "",
                    {"agent": run.agent, "status": run.status, "via": "admin"},
                )
            )

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """A summary instead of every journal entry; and only ``delete_run`` is needed, since
        the rows that go with a run cannot be deleted on their own."""
        runs = list(objs)
        ids = [r.pk for r in runs]
        related: list[tuple[Any, str]] = [
            (JournalEntry, "journal entries"),
            (ApprovalRequest, "approval requests"),
            (Halt, "halts"),
            (Lease, "leases"),
        ]
        counts: dict[str, dict[str, int]] = {}
        for model, label in related:
            rows = (
                model._default_manager.filter(run_id__in=ids)
                .values("run_id")
                .annotate(n=Count("pk"))
            )
            counts[label] = {r["run_id"]: r["n"] for r in rows}
        summary = [
            f"Run: {run.run_id} ({', '.join(f'{c.get(run.pk, 0)} {k}' for k, c in counts.items())})"
            for run in runs
        ]
        model_count = {str(Run._meta.verbose_name_plural): len(runs)}
        model_count.update({k: sum(c.values()) for k, c in counts.items()})
        return summary, model_count, set(), []


# -- history ------------------------------------------------------------------------------


@admin.register(ActionLog)
class ActionLogAdmin(_ReadOnly):
    list_display = (
        "created_at",
        "actor",
        "channel",
        "action",
        "run_link",
        "target",
        "payload_pretty",
    )
    list_filter = ("action", "actor")
    search_fields = ("run_id", "target")

    @admin.display(description="payload")
    def payload_pretty(self, obj: ActionLog) -> str:
        return _json_cell(obj.payload)
