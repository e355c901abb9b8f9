"""What every durable_agents model admin shares: the read-only base with its command URLs,
the status filter that opens on a queue, and the list cells (correlated counts, JSON)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db import connections, transaction
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from . import views as views
from .timeline import pretty

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
