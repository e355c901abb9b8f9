"""The action log in the admin: every staff, API, command or Python action on a run
(approve, deny, resolve, fork, cancel, resume, delete…), and on keys (``create_key``,
``confirm_key``, ``revoke_key``: no run), with who, how and when. Read-only, like the log
itself; each run's page shows its own rows too."""

from __future__ import annotations

from django.contrib import admin

from ..models import ActionLog
from .base import ReadOnlyAdmin, json_cell


@admin.register(ActionLog)
class ActionLogAdmin(ReadOnlyAdmin):
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

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: ActionLog) -> str:
        return super().run_link(obj) if obj.run_id else "—"  # a key's row names no run

    @admin.display(description="payload")
    def payload_pretty(self, obj: ActionLog) -> str:
        return json_cell(obj.payload)
