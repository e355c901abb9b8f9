"""Template tags of durable_agents' admin pages."""

from __future__ import annotations

import re
from typing import Any

from django import template
from django.utils.html import format_html, strip_tags
from django.utils.safestring import mark_safe
from django.utils.text import capfirst

from ..admin.counts import with_counts

register = template.Library()


@register.simple_tag(takes_context=True)
def with_pending_counts(context: Any, app_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The app list with how much waits on a person after durable_agents' model names."""
    request = context.get("request")
    return with_counts(app_list, getattr(request, "user", None))


_CELL = re.compile(r"^\s*<(td|th)\b")


@register.filter
def labelled_cells(result: list[str], headers: list[dict[str, Any]]) -> list[str]:
    """A change list row's cells, each carrying its column's title (``data-label``): on a
    phone the row is drawn as a card and each cell shows its title beside it (admin.css),
    since the table's header row is hidden there. The checkbox and the row's first cell
    (the card's title: the run, the call, the key) get none."""
    out = []
    titled = False
    for cell, header in zip(result, headers, strict=False):
        text = str(cell)
        match = _CELL.match(text)
        if match is None or "action-checkbox" in str(header.get("class_attrib", "")):
            out.append(cell)
            continue
        if not titled:  # the card's title
            titled = True
            out.append(cell)
            continue
        label = capfirst(strip_tags(str(header.get("text", ""))).strip())
        attribute = format_html(' data-label="{}"', label)
        out.append(mark_safe(text[: match.end()] + attribute + text[match.end() :]))
    return out
