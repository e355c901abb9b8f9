"""How much waits on a person, for the admin index and the app's model list: tool calls
awaiting approval, open halts, runs awaiting a person's input. Each count is one indexed
``COUNT`` (status is the leading column of each table's status index), made only for what
the user may see (``durable_agents.permissions``), whatever the number of finished rows.

The admin index has no hook for an app (see ``health``): building it, the admin asks each
model admin whether the user may see its app, and the queue and run admins call
``note_on_index``, which adds the counts to the page's messages once per request. The app's
own model list (``admin/durable_agents/app_index.html``) puts them after the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db import DatabaseError
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import permissions
from ..engine.ports import APPROVAL_PENDING, AWAITING_INPUT, HALT_OPEN
from ..models import ApprovalRequest, Halt, Run

_SEEN = "_durable_agents_pending_counts"


@dataclass(frozen=True)
class Waiting:
    model: str  # the model's name in the admin's URLs: approvalrequest, halt, run
    what: str  # "tool calls awaiting approval"
    n: int
    url: str  # the list, filtered on what waits


def pending_counts(user: Any) -> list[Waiting]:
    """What waits on a person that ``user`` may see, in a fixed order (zero counts
    included)."""
    changelist = "admin:durable_agents_{}_changelist"
    out = []
    if permissions.allows(user, "view_approvals"):
        n = ApprovalRequest.objects.filter(status=APPROVAL_PENDING).count()
        url = reverse(changelist.format("approvalrequest")) + f"?status={APPROVAL_PENDING}"
        out.append(Waiting("approvalrequest", "tool calls awaiting approval", n, url))
    if permissions.allows(user, "view_halts"):
        n = Halt.objects.filter(status=HALT_OPEN).count()
        url = reverse(changelist.format("halt")) + f"?status={HALT_OPEN}"
        out.append(Waiting("halt", "open halts", n, url))
    if permissions.allows(user, "view_runs"):
        n = Run.objects.filter(status=AWAITING_INPUT).count()
        url = reverse(changelist.format("run")) + f"?status__exact={AWAITING_INPUT}"
        out.append(Waiting("run", "runs awaiting input", n, url))
    return out


def note_on_index(request: HttpRequest) -> None:
    """On the admin index, once per request: "Waiting on a person: 3 tool calls awaiting
    approval, 1 open halt" with links, when anything the user may see waits."""
    match = getattr(request, "resolver_match", None)
    if match is None or match.url_name != "index" or getattr(request, _SEEN, False):
        return
    setattr(request, _SEEN, True)
    try:
        waiting = [w for w in pending_counts(request.user) if w.n]
    except DatabaseError:
        return  # the index must open even when this read fails
    if waiting:
        links = format_html_join(
            ", ",
            '<a href="{}" class="da-waiting-{}">{} ({})</a>',
            ((w.url, w.model, w.what, w.n) for w in waiting),
        )
        # A warning, not the admin's green "done" style: someone has to act.
        messages.warning(
            request,
            format_html(
                'Durable agents, waiting on a person: {}. <a href="{}" id="da-inbox-link">'
                "Open the inbox</a>",
                links,
                reverse("admin:durable_agents_inbox"),
            ),
            fail_silently=True,
        )


def with_counts(app_list: list[dict[str, Any]], user: Any) -> list[dict[str, Any]]:
    """``app_list`` (the admin's) with durable_agents' model names followed by their count:
    "Inbox (6)", "Tool calls awaiting approval (3)", "Halts (1)", "Runs (2 awaiting
    input)"."""
    try:
        counts = {w.model: w for w in pending_counts(user)}
    except DatabaseError:
        return app_list
    out = []
    for app in app_list:
        if app.get("app_label") != "durable_agents":
            out.append(app)
            continue
        models = []
        for m in app["models"]:
            model = str(m.get("object_name", "")).lower()
            w = counts.get(model)
            if model == "inbox":  # everything the user may see waiting on a person
                total = sum(c.n for c in counts.values())
                name = f"{m['name']} ({total})" if total else m["name"]
            elif w is not None and w.model == "run":
                name = f"{m['name']} ({w.n} awaiting input)" if w.n else m["name"]
            elif w is not None:
                name = f"{m['name']} ({w.n})"
            else:
                name = m["name"]
            models.append({**m, "name": name})
        out.append({**app, "models": models})
    return out
