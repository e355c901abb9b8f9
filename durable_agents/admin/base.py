"""What every durable_agents model admin shares: the read-only base with its command URLs,
the status filter that opens on a queue, the list cells (correlated counts, JSON), and the
helpers the POST handlers share (who acts, URLs, refusals, pages, JSON form fields).

Glue only: every change goes through an engine command (``approve``, ``resolve_halt``,
``cancel``, ``fork``, ``hand_over``), which also writes the action log; nothing here sets a
status. Each handler
checks its own permission, so a POST made without the button is refused the same way. A
hand-over to a driver that fails (the Celery broker is down) is a warning, not a 500: what
staff decided is recorded by then, and the page says how the run gets going again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from .. import permissions
from ..engine.identity import Actor
from ..people import actor_of
from .paging import CappedPaginator
from .pretty import pretty

if TYPE_CHECKING:
    AnyModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    AnyModelAdmin = admin.ModelAdmin

ADMIN = "admin"  # the channel action log rows record for what staff do here
CSS = {"all": ["durable_agents/admin.css"]}
JSON_PREVIEW = 1500  # characters of a JSON value shown in a list row

log = logging.getLogger("durable_agents.admin")

# What gets a run whose hand-over failed going again. Beat recovery re-enqueues runs that
# are queued or running (a decided or resolved run is queued first), not ones paused on a
# person.
BY_RECOVERY = "beat recovery hands it to a worker on its next pass"
BY_RESUME = "press Resume on the run page once workers are reachable again"


# -- who acts, and may they -----------------------------------------------------------------


def admin_actor(request: HttpRequest) -> Actor:
    """The signed-in user as the engine's ``Actor``, acting through the admin."""
    return actor_of(request.user, ADMIN)


def allows(request: HttpRequest, action: str) -> bool:
    """May this user do ``action`` (``durable_agents.permissions``, the API's table too)?"""
    return permissions.allows(request.user, action)


def require(request: HttpRequest, action: str) -> None:
    """PermissionDenied unless this user may do ``action``."""
    if not allows(request, action):
        raise PermissionDenied


# -- URLs and responses ---------------------------------------------------------------------


def admin_url(admin: AnyModelAdmin, name: str, *args: Any) -> str:
    opts = admin.model._meta
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_{name}",
        args=args,
        current_app=admin.admin_site.name,
    )


def run_url(admin: AnyModelAdmin, run_id: str) -> str:
    return reverse(
        "admin:durable_agents_run_change", args=[quote(run_id)], current_app=admin.admin_site.name
    )


def object_gone(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """Back to the list, saying the object is gone (as the admin's own pages do)."""
    opts = admin.model._meta
    messages.warning(
        request,
        f"{opts.verbose_name} with ID {object_id!r} does not exist. Perhaps it was deleted?",
    )
    return HttpResponseRedirect(admin_url(admin, "changelist"))


def posted_object(admin: AnyModelAdmin, request: HttpRequest, object_id: str, action: str) -> Any:
    """The object a command's POST acts on, or the response that refuses the request (not a
    POST, or the object is gone); without the permission ``action`` needs, PermissionDenied."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require(request, action)
    obj = admin.get_object(request, unquote(object_id))
    return object_gone(admin, request, object_id) if obj is None else obj


def not_handed_over(request: HttpRequest, recorded: str, exc: Exception, then: str) -> None:
    """Warn that ``recorded`` stands but the run did not reach a worker, and say ``then``."""
    log.warning("%s, but handing the run to a driver failed", recorded, exc_info=exc)
    messages.warning(
        request,
        f"{recorded}, but the run could not be handed to a worker now "
        f"({type(exc).__name__}: {exc}); {then}.",
    )


def page(
    admin: AnyModelAdmin,
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


# -- list cells -----------------------------------------------------------------------------


def related_count(model: Any, link: str, **filters: Any) -> Coalesce:
    """A correlated COUNT, so a list row's counts come in the page's one query."""
    rows = (
        model.objects.filter(**{link: OuterRef("pk")}, **filters)
        .order_by()
        .values(link)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


def json_cut(value: Any) -> bool:
    """Whether ``json_cell`` shows only the start of ``value``."""
    return len(pretty(value)) > JSON_PREVIEW


def json_cell(value: Any) -> str:
    """A JSON value for a list row, cut at ``JSON_PREVIEW`` characters (``da-json-cut``: the
    rest is a click away, so its box may scroll; a whole value is drawn whole)."""
    text = pretty(value)
    if len(text) > JSON_PREVIEW:
        return format_html('<pre class="da-json da-json-cut">{}\n…</pre>', text[:JSON_PREVIEW])
    return format_html('<pre class="da-json">{}</pre>', text)


def short_time(when: Any) -> str:
    """A moment for a list cell, in the site's time zone: ``2026-03-01 14:05``."""
    return f"{timezone.localtime(when):%Y-%m-%d %H:%M}" if when else "-"


def status_pill(status: str) -> str:
    """A status as a coloured pill (admin.css ``da-pill-<status>``): the same colour for a
    status on every list and page; waiting on a person is amber, never a success green."""
    return format_html(
        '<span class="da-pill da-pill-{}">{}</span>', status, str(status).replace("_", " ")
    )


# -- the model admins' base and filter --------------------------------------------------------


def refuse_nul(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view``, answering 404 when its URL or query holds a NUL (no id contains one) and
    400 when a posted field does: PostgreSQL refuses the byte in any text or JSON it is
    asked to compare or store, which would be a 500."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if any(_has_nul(v) for v in (*args, *kwargs.values())) or _has_nul(request.GET):
            raise Http404("no object has an id with a NUL character")
        if request.method == "POST" and _has_nul(request.POST):
            return HttpResponseBadRequest(
                "a field holds a NUL character, which no value here may contain",
                content_type="text/plain",
            )
        return view(request, *args, **kwargs)

    return guarded


def _has_nul(value: Any) -> bool:
    if isinstance(value, QueryDict):
        return any(_has_nul(k) or any(map(_has_nul, vs)) for k, vs in value.lists())
    return "\x00" in str(value)


class DurableAdmin(AnyModelAdmin):
    """What every model admin of this app shares: each of its URLs (Django's own pages and
    the command pages a subclass adds) refuses a NUL in its URL or query with a 404."""

    @property
    def urls(self) -> list[URLPattern]:
        patterns = self.get_urls()
        for pattern in patterns:
            pattern.callback = refuse_nul(pattern.callback)
        return patterns


class ReadOnlyAdmin(DurableAdmin):
    """Rows the engine writes: staff look, and act only through commands. Their lists
    count at most ``paging.CAP`` rows and never the whole table: these tables grow with
    every run (``paging``)."""

    paginator = CappedPaginator
    show_full_result_count = False

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

    def command_path(
        self, suffix: str, view: Callable[..., HttpResponse], route: str = ""
    ) -> URLPattern:
        """``<object_id>/<suffix>/``, or ``route`` for a page that is not one object's."""
        opts = self.model._meta
        return path(
            route or f"<path:object_id>/{suffix}/",
            self._view(view),
            name=f"{opts.app_label}_{opts.model_name}_{suffix}",
        )

    @admin.display(description="run", ordering="run_id")
    def run_link(self, obj: Any) -> str:
        return format_html('<a href="{}">{}</a>', run_url(self, obj.run_id), obj.run_id)


class DefaultStatusFilter(admin.SimpleListFilter):
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
