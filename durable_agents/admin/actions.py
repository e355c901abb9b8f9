"""The action log in the admin: every staff, API, command or Python action on a run
(approve, deny, resolve, fork, cancel, resume, delete…), and on keys (``create_key``,
``confirm_key``, ``revoke_key``: no run), with who, how and when. Read-only, like the log
itself; each run's page shows its own rows too."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from ..models import ActionLog
from .base import ReadOnlyAdmin, json_cell, short_time


@admin.register(ActionLog)
class ActionLogAdmin(ReadOnlyAdmin):
    # Few columns, so the list fits beside the admin's menus and filters at 1400 px: when
    # (a link to the row), who and through which channel, what and on which target, the
    # run, the details.
    list_display = ("when", "actor_cell", "action_cell", "run_link", "payload_pretty")
    list_filter = ("action", "actor")
    search_fields = ("run_id", "target")

    @admin.display(description="when", ordering="created_at")
    def when(self, obj: ActionLog) -> str:
        return short_time(obj.created_at)

    @admin.display(description="who", ordering="actor")
    def actor_cell(self, obj: ActionLog) -> str:
        return format_html(
            '{}<div class="da-cell-line">{}</div>', obj.actor, obj.channel or "channel unknown"
        )

    @admin.display(description="action", ordering="action")
    def action_cell(self, obj: ActionLog) -> str:
        target = format_html('<div class="da-cell-line">{}</div>', obj.target) if obj.target else ""
        return format_html('<strong class="da-action">{}</strong>{}', obj.action, target)

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: ActionLog) -> str:
        return super().run_link(obj) if obj.run_id else "—"  # a key's row names no run

    @admin.display(description="payload")
    def payload_pretty(self, obj: ActionLog) -> str:
        return json_cell(obj.payload)
