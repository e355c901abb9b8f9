"""A run's place in its tree of sub-runs (``agent.as_tool()``), for the run page, and the
runs list's filter that hides sub-runs. See docs/composition.md."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..database import reads
from ..models import Run
from .base import AnyModelAdmin, run_url


def tree(admin: AnyModelAdmin, run: Any) -> dict[str, Any]:
    """The run's parent and root, and the sub-runs its calls started with the status of
    each (two queries: its ``child:`` records, then their rows by primary key)."""
    # The record names the sub-run: ``<run>/<call>``, or, in a fork, its source's ended
    # child, which the fork references instead of running again.
    ids = [child.run_id for child in reads.children(run.run_id)]
    rows: dict[str, tuple[str, str]] = {
        run_id: (agent, status)
        for run_id, agent, status in Run.objects.filter(run_id__in=ids).values_list(
            "run_id", "agent", "status"
        )
    }
    children = [
        {
            "run_id": i,
            "agent": rows.get(i, ("", ""))[0],
            "status": rows.get(i, ("", "not started"))[1],
            "url": run_url(admin, i),
            "referenced": not i.startswith(f"{run.run_id}/"),
        }
        for i in ids
    ]

    def link(run_id: str | None) -> dict[str, str] | None:
        return {"run_id": run_id, "url": run_url(admin, run_id)} if run_id else None

    return {
        "tree_parent": link(run.parent_run_id),
        "tree_root": link(run.root_run_id if run.root_run_id != run.parent_run_id else None),
        "tree_children": children,
    }


class TreeFilter(admin.SimpleListFilter):
    """Top-level runs only (hiding sub-runs), or sub-runs only."""

    title = "tree"
    parameter_name = "tree"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("roots", "Top-level runs only"), ("children", "Sub-runs only")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        if self.value() == "roots":
            return queryset.filter(parent_run_id__isnull=True)
        if self.value() == "children":
            return queryset.filter(parent_run_id__isnull=False)
        return queryset
