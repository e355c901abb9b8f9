"""Lists that stay as fast with a million runs as with a thousand (docs/admin.md, "Large
sites").

Django's change list counts its rows twice per page: the filtered rows for the paginator
and, for "N results (M total)", the whole table. A ``COUNT(*)`` reads every row it counts,
so on a table of a million runs each list page took as long as reading them all.
``CappedPaginator`` counts at most ``CAP`` rows (``SELECT COUNT(*) FROM (… LIMIT CAP + 1)``,
read through the list's own index) and the page then says "more than 10,000"; the admins
set ``show_full_result_count = False`` so the second count is never made. A list past the
cap offers its first ``CAP / list_per_page`` pages: older rows are found with the filters
(the creation date, status, agent) or the search, which is how anyone finds them anyway,
and no page is ever deeper than ``CAP`` rows (an ``OFFSET`` reads and drops every row before
the page).

``DistinctAgentFilter`` lists the agents on the runs list's sidebar without
``SELECT DISTINCT agent`` (a read of the whole index): a loose index scan, one index probe
per agent.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.paginator import Page, Paginator
from django.db import connections, router

if TYPE_CHECKING:
    AnyPaginator = Paginator[Any]
else:  # Paginator is generic only in the type stubs
    AnyPaginator = Paginator

CAP = 10_000  # rows a list counts before it says "more than"
AGENTS_SHOWN = 200  # agents the sidebar filter lists (a site has a few dozen)


class CappedPaginator(AnyPaginator):
    """A paginator whose count stops at ``CAP`` (``capped`` says it did)."""

    capped = False

    @cached_property
    def count(self) -> int:
        rows: Any = self.object_list
        if not hasattr(rows, "query"):  # a list: its length costs nothing
            return len(rows)
        # Only the primary keys: the list's annotations (correlated counts, excerpts) are
        # computed for the page's rows, not for every row counted. The order stays, so the
        # rows counted come off the list's index in order and the LIMIT stops the read.
        n = rows.values("pk")[: CAP + 1].count()
        if n > CAP:
            self.capped = True
            return CAP
        return int(n)

    def page(self, number: Any) -> Any:
        """A page after the first is read in two steps: its primary keys off the list's
        index (``OFFSET`` skips bare keys), then its rows with their annotations. In one
        statement the database computes a row's correlated counts for every row it skips,
        so page 100 of the runs list computed them for 10,000 runs."""
        number = self.validate_number(number)
        rows: Any = self.object_list
        bottom = (number - 1) * self.per_page
        if bottom == 0 or not hasattr(rows, "query"):
            return super().page(number)
        keys = list(rows.values_list("pk", flat=True)[bottom : bottom + self.per_page])
        return Page(list(rows.filter(pk__in=keys)), number, self)


def distinct_agents(model: Any, limit: int = AGENTS_SHOWN) -> list[str]:
    """The distinct ``agent`` values of ``model``'s table, in order: each found by one probe
    of the agent index (``MIN(agent) WHERE agent > previous``), so the cost follows the
    number of agents, not of runs. The same SQL runs on SQLite."""
    alias = router.db_for_read(model)
    connection = connections[alias]
    table = connection.ops.quote_name(model._meta.db_table)
    sql = (
        f"WITH RECURSIVE agents(agent) AS ("
        f" SELECT MIN(agent) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN(agent) FROM {table} WHERE agent > agents.agent)"
        f" FROM agents WHERE agents.agent IS NOT NULL"
        f") SELECT agent FROM agents WHERE agent IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


class DistinctAgentFilter(admin.AllValuesFieldListFilter):
    """Django's filter by each value of ``agent`` (same parameters, same choices), its
    values read by ``distinct_agents``."""

    def __init__(
        self, field: Any, request: Any, params: Any, model: Any, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(field, request, params, model, *args, **kwargs)
        # The parent set a lazy DISTINCT query here; it is never run.
        self.lookup_choices = distinct_agents(model)  # type: ignore[assignment]


def counted(rows: Any, cap: int = CAP) -> tuple[int, bool]:
    """How many rows ``rows`` holds, counting at most ``cap`` of them, and whether it
    stopped there (the queues' pages say "more than" then). Any ``cap + 1`` rows will do:
    unordered, they come off the status index without a sort of the whole queue."""
    n = int(rows.order_by().values("pk")[: cap + 1].count())
    return min(n, cap), n > cap
