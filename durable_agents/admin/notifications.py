"""The notification outbox in the admin: what was told to whom, and above all what was not.

The list opens on the notifications not sent — given up (``failed``) or still being tried
(``pending``) — with why the last try failed and when the next is due, and takes one
action, **Retry** (``notifications.outbox.retry``, logged in the action history). A row's
cells come from its own columns and payload, so a page is one query (and a capped count)
whatever its size. Registered when ``durable_agents.admin`` imports this module.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ..conf import NOTIFY_EVENTS, get_settings
from ..engine.errors import ConfigError
from ..models import Notification
from ..notifications.outbox import retry
from .base import ReadOnlyAdmin, admin_actor, allows, json_cell, short_time, status_pill

UNSENT = "unsent"


class NotificationStatusFilter(admin.SimpleListFilter):
    """Opens on what was not sent (failed or pending), with each status and "All"."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(UNSENT, "not sent"), *Notification.STATUSES, ("all", "All")]

    def value(self) -> str:
        return str(super().value() or UNSENT)

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == UNSENT:
            return queryset.filter(status__in=[Notification.FAILED, Notification.PENDING])
        return queryset if value == "all" else queryset.filter(status=value)

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


class EventFilter(admin.SimpleListFilter):
    title = "event"
    parameter_name = "event"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(e, e.removeprefix("approval_")) for e in NOTIFY_EVENTS]

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(event=self.value()) if self.value() else queryset


class ChannelFilter(admin.SimpleListFilter):
    """The channels the settings name (no query: a DISTINCT over the outbox would read it
    whole)."""

    title = "channel"
    parameter_name = "channel"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        try:
            channels = get_settings().notify.channels
        except ConfigError:
            return []
        return [(c.name, c.name) for c in channels]

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(channel=self.value()) if self.value() else queryset


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("about_cell", "channel_cell", "status_cell", "error_cell")
    list_display_links = None  # the about cell links the row's page and the call's
    list_filter = (NotificationStatusFilter, EventFilter, ChannelFilter)
    search_fields = ("=delivery_id",)
    actions = ["retry_selected"]
    readonly_fields = ("payload_pretty",)
    exclude = ("payload",)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return allows(request, "retry_notifications")

    @admin.action(description="Retry selected notifications", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        changed = retry(ids, admin_actor(request))
        skipped = len(ids) - changed
        messages.success(
            request,
            f"{changed} notification(s) will be tried again at the next delivery pass"
            + (f"; {skipped} already sent were left as they are" if skipped else ""),
        )

    @admin.display(description="notification", ordering="created_at")
    def about_cell(self, obj: Notification) -> str:
        payload = obj.payload if isinstance(obj.payload, dict) else {}
        what = payload.get("summary") or payload.get("tool") or "?"
        return format_html(
            '<a href="{}"><strong>{}</strong></a>: {}'
            '<div class="da-cell-line">call <a href="{}"><code>{}</code></a> of run {}</div>'
            '<div class="da-cell-line da-at">{}</div>',
            reverse("admin:durable_agents_notification_change", args=[obj.pk]),
            obj.event.removeprefix("approval_"),
            what,
            reverse("admin:durable_agents_approvalrequest_change", args=[obj.request_id]),
            payload.get("call_id", ""),
            payload.get("run_id", ""),
            short_time(obj.created_at),
        )

    @admin.display(description="channel", ordering="channel")
    def channel_cell(self, obj: Notification) -> str:
        return format_html(
            '{}<div class="da-cell-line"><code>{}</code></div>', obj.channel, obj.delivery_id
        )

    @admin.display(description="status", ordering="status")
    def status_cell(self, obj: Notification) -> str:
        if obj.status == Notification.SENT:
            when = f"sent {short_time(obj.sent_at)}"
        elif obj.status == Notification.PENDING:
            when = f"next try {short_time(obj.next_attempt_at)}"
        else:
            when = "given up: Retry to try again"
        return format_html(
            '{}<div class="da-cell-line">{} tr{}</div><div class="da-cell-line">{}</div>',
            status_pill(obj.status),
            obj.attempts,
            "y" if obj.attempts == 1 else "ies",
            when,
        )

    @admin.display(description="last error")
    def error_cell(self, obj: Notification) -> str:
        return obj.last_error or "—"

    @admin.display(description="payload (what is sent)")
    def payload_pretty(self, obj: Notification) -> str:
        return json_cell(obj.payload)
