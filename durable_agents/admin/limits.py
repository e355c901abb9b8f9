"""Limits in the admin: the runs waiting on a limit (``throttled``), what each waits for and
when it tries again, under a table of every limit with its slots in use (docs/limits.md).
Registered when ``durable_agents.admin`` imports this module."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse

from ..conf import get_settings
from ..database.reads import limit_queues
from ..engine.errors import DurableAgentsError
from ..engine.ports import THROTTLED
from ..models import Run, Throttle
from .base import ReadOnlyAdmin, allows


@admin.register(Throttle)
class ThrottleAdmin(ReadOnlyAdmin):
    list_display = ("run_link", "agent", "key", "limit", "reason", "since", "retry_at", "tries")
    list_display_links = None
    list_filter = ("agent", "key")
    search_fields = ("run_id",)
    ordering = ("since", "run_id")
    change_list_template = "admin/durable_agents/throttle/change_list.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or allows(request, "view_runs")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Throttle]:
        # A row beside a run no longer throttled is an old wait: only the waiting are shown.
        throttled = Run.objects.filter(run_id=OuterRef("run_id"), status=THROTTLED)
        return super().get_queryset(request).filter(Exists(throttled))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        try:
            queues: list[Any] = limit_queues(get_settings().database)
            problem = ""
        except DurableAgentsError as exc:  # the agents cannot be loaded: the check says why
            queues, problem = [], str(exc)
        context = {**(extra_context or {}), "limit_queues": queues, "limits_problem": problem}
        return super().changelist_view(request, extra_context=context)
