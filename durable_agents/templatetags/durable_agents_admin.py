"""Template tags of durable_agents' admin pages."""

from __future__ import annotations

from typing import Any

from django import template

from ..admin.counts import with_counts

register = template.Library()


@register.simple_tag(takes_context=True)
def with_pending_counts(context: Any, app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The app list with how much waits on a person after durable_agents' model names."""
    request = context.get("request")
    return with_counts(app_list, getattr(request, "user", None))
