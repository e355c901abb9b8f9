"""The staff admin: runs and their journal timeline, the queue of tool calls awaiting
approval, halts and the action history (keys: ``admin_keys``; fork and compare:
``admin_history``; sessions: ``admin_sessions``).

Every page is read-only: staff change runs only through engine commands (approve, deny,
resolve, cancel, resume), each behind its own permission and each written to ActionLog.
List pages annotate what they show, so they cost the same number of queries whatever the
page size. See docs/admin.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import Count, Exists, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from . import admin_history as history
from . import admin_keys  # noqa: F401  (registers the API key and approver key admins)
from . import admin_sessions as sessions
from . import admin_views as views
from .admin_timeline import pretty
from .engine.ports import APPROVAL_PENDING, HALT_OPEN, ActionInfo
from .models import (
    ActionLog,
    ApprovalRequest,
    Decision,
    Halt,
    JournalEntry,
    Lease,
    Run,
)
from .storage import DjangoStore

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin

CSS = {"all": ["durable_agents/admin.css"]}
JSON_PREVIEW = 1500  # characters of a JSON value shown in a list row


def _count(model: Any, link: str, **filters: Any) -> Coalesce:
    """A correlated COUNT, so a list row's counts come in the page's one query."""
    rows = (
        model.objects.filter(**{link: OuterRef("pk")}, **filters)
        .order_by()
        .values(link)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


def _json_cell(value: Any) -> str:
    text = pretty(value)
    if len(text) > JSON_PREVIEW:
        text = text[:JSON_PREVIEW] + "\n…"
    return format_html('<pre class="da-json">{}</pre>', text)


class _ReadOnly(_ModelAdmin):
    """Rows the engine writes: staff look, and act only through commands."""

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _view(self, view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        """An admin URL for ``view(self, request, **url_kwargs)``: staff only, CSRF-checked,
        and never inside ATOMIC_REQUESTS (engine commands commit step by step and hand the
        run over after commit)."""

        def handler(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            return view(self, request, **kwargs)

        for alias in connections:
            handler = transaction.non_atomic_requests(using=alias)(handler)
        return self.admin_site.admin_view(handler)

    def _url(self, suffix: str, view: Callable[..., HttpResponse], route: str = "") -> URLPattern:
        """``<object_id>/<suffix>/``, or ``route`` for a page that is not one object's."""
        opts = self.model._meta
        return path(
            route or f"<path:object_id>/{suffix}/",
            self._view(view),
            name=f"{opts.app_label}_{opts.model_name}_{suffix}",
        )

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Any) -> str:
        return format_html('<a href="{}">{}</a>', views.run_url(self, obj.run_id), obj.run_id)


class _DefaultStatus(admin.SimpleListFilter):
    """A status filter that opens on the queue (``default``), with an explicit "All"."""

    title = "status"
    parameter_name = "status"
    default = ""
    options: list[tuple[str, str]] = []

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [*self.options, ("all", "All")]

    def value(self) -> str:
        return str(super().value() or self.default)

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value == "all" else queryset.filter(status=value)

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


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
        ("Times", {"fields": ["created_at", "updated_at", "finished_at"]}),
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
        return super().has_view_permission(request, obj) or any(
            request.user.has_perm(p) for p in (views.OPERATE_PERMISSION, views.FORK_PERMISSION)
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _ModelAdmin.has_delete_permission(self, request, obj)

    def has_cancel_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(views.OPERATE_PERMISSION)

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
        for run in runs:
            store.log_action(
                ActionInfo(
                    request.user.get_username(),
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


# -- approvals ----------------------------------------------------------------------------


class ApprovalStatusFilter(_DefaultStatus):
    default = APPROVAL_PENDING
    options = [(s, label) for s, label in ApprovalRequest.STATUSES]


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(_ReadOnly):
    list_display = (
        "call_id",
        "run_link",
        "tool_name",
        "arguments_pretty",
        "run_input",
        "quorum",
        "status",
        "created_at",
    )
    list_filter = (ApprovalStatusFilter, "tool_name")
    search_fields = ("run__run_id", "call_id", "tool_name")
    list_select_related = ("run",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalRequest]:
        rows: QuerySet[ApprovalRequest] = (
            super()
            .get_queryset(request)
            .annotate(
                n_approved=_count(Decision, "request", approved=True),
                n_denied=_count(Decision, "request", approved=False),
            )
        )
        return rows

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(
            views.APPROVE_PERMISSION
        )

    def get_urls(self) -> list[URLPattern]:
        return [self._url("decide", views.approval_decide_view), *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return views._missing(self, request, object_id)
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return views.approval_detail(self, request, obj)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj: ApprovalRequest) -> str:
        return _json_cell(obj.arguments)

    @admin.display(description="run input")
    def run_input(self, obj: ApprovalRequest) -> str:
        return _json_cell(obj.run.input)

    @admin.display(description="quorum")
    def quorum(self, obj: Any) -> str:
        return views.progress(obj.policy, obj.n_approved, obj.n_denied)


# -- halts --------------------------------------------------------------------------------


class HaltStatusFilter(_DefaultStatus):
    default = HALT_OPEN
    options = [(s, label) for s, label in Halt.STATUSES]


@admin.register(Halt)
class HaltAdmin(_ReadOnly):
    list_display = (
        "op_id",
        "run_link",
        "tool_name",
        "arguments_pretty",
        "cause",
        "attempted_at",
        "status",
        "lease_live",
    )
    list_filter = (HaltStatusFilter, "cause")
    search_fields = ("run__run_id", "op_id", "tool_name")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Halt]:
        live = Lease.objects.filter(run_id=OuterRef("run_id"), expires_at__gt=Now())
        rows: QuerySet[Halt] = super().get_queryset(request).annotate(has_live_lease=Exists(live))
        return rows

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(
            views.RESOLVE_PERMISSION
        )

    def get_urls(self) -> list[URLPattern]:
        return [self._url("resolve", views.halt_resolve_view), *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return views._missing(self, request, object_id)
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return views.halt_detail(self, request, obj)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj: Halt) -> str:
        return _json_cell(obj.arguments)

    @admin.display(description="driver holds lease", boolean=True, ordering="has_live_lease")
    def lease_live(self, obj: Any) -> bool:
        return bool(obj.has_live_lease)


# -- history ------------------------------------------------------------------------------


@admin.register(ActionLog)
class ActionLogAdmin(_ReadOnly):
    list_display = ("created_at", "actor", "action", "run_link", "target", "payload_pretty")
    list_filter = ("action", "actor")
    search_fields = ("run_id", "target")

    @admin.display(description="payload")
    def payload_pretty(self, obj: ActionLog) -> str:
        return _json_cell(obj.payload)
