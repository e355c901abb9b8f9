"""Issue 33: the API's lists page by cursor (keyset) as well as by offset. A cursor page
continues where the previous page stopped, whatever was added at the top since, without a
count; ``count=false`` leaves the count out of an offset page too. Offset pages keep the
count and shape docs/api.md promised."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from durable_agents.database.store import DjangoStore
from durable_agents.engine.ports import RunInfo
from durable_agents.models import ApprovalRequest, Halt, Run
from tests.support.api import error, staff_with

pytestmark = pytest.mark.django_db(transaction=True)


def _runs(n: int, *, same_time: int = 0) -> list[str]:
    """``n`` runs a second apart, newest last; the last ``same_time`` share one creation
    time (ties, broken by run id)."""
    store = DjangoStore()
    now = timezone.now()
    ids = []
    for i in range(n):
        run_id = f"cur-{i:03d}"
        store.create_run(RunInfo(run_id, agent="echo", input="x"))
        at = now - timedelta(seconds=max(n - i, same_time))
        Run.objects.filter(run_id=run_id).update(created_at=at)
        ids.append(run_id)
    return ids


def _walk(caller, path: str, limit: int, **params) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        body = caller.get(path, **query).json()
        pages.append(
            [item.get("run_id", "") + "#" + str(item.get("call_id", "")) for item in body["items"]]
        )
        if cursor:
            assert body["count"] is None  # a cursor page is never counted
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_cursor_pages_are_the_offset_pages_and_ties_break_by_id():
    ids = _runs(23, same_time=6)
    caller = staff_with()
    by_offset = [
        [r["run_id"] for r in caller.get("/runs", limit=5, offset=o).json()["items"]]
        for o in range(0, 25, 5)
    ]
    first = caller.get("/runs", limit=5).json()
    assert first["count"] == 23 and first["offset"] == 0 and first["next_cursor"]
    by_cursor = [[i.split("#")[0] for i in page] for page in _walk(caller, "/runs", 5)]
    assert by_cursor == by_offset
    assert [i for page in by_cursor for i in page] == sorted(
        ids, key=lambda i: (Run.objects.get(run_id=i).created_at, i), reverse=True
    )


def test_a_cursor_page_is_stable_when_runs_are_added_at_the_top():
    _runs(10)
    caller = staff_with()
    first = caller.get("/runs", limit=4).json()
    DjangoStore().create_run(RunInfo("cur-newest", agent="echo", input="x"))
    second = caller.get("/runs", limit=4, cursor=first["next_cursor"]).json()
    assert [r["run_id"] for r in second["items"]] == ["cur-005", "cur-004", "cur-003", "cur-002"]
    # An offset page shifts by the new run instead.
    shifted = caller.get("/runs", limit=4, offset=4).json()
    assert shifted["items"][0]["run_id"] == "cur-006"


def test_cursor_with_filters_and_count_false():
    _runs(8)
    Run.objects.filter(run_id__in=["cur-001", "cur-003", "cur-006"]).update(status="failed")
    caller = staff_with()
    page = caller.get("/runs", limit=2, status="failed", count="false").json()
    assert page["count"] is None
    assert [r["run_id"] for r in page["items"]] == ["cur-006", "cur-003"]
    rest = caller.get("/runs", limit=2, status="failed", cursor=page["next_cursor"]).json()
    assert [r["run_id"] for r in rest["items"]] == ["cur-001"] and rest["next_cursor"] is None


def test_approval_and_halt_lists_page_by_cursor():
    _runs(1)
    for i in range(5):
        ApprovalRequest.objects.create(
            run_id="cur-000", call_id=f"c{i}", tool_name="refund", start_seq=1
        )
        Halt.objects.create(run_id="cur-000", op_id=f"h{i}", tool_name="charge")
    caller = staff_with("durable_agents.view_approvalrequest", "durable_agents.view_halt")
    for path in ("/approvals", "/halts"):
        pages = _walk(caller, path, 2)
        assert [len(p) for p in pages] == [2, 2, 1]
        offset = [
            f"cur-000#{i.get('call_id')}"
            for o in (0, 2, 4)
            for i in caller.get(path, limit=2, offset=o).json()["items"]
        ]
        assert [i for page in pages for i in page] == offset


def _cursor(*parts) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        "%%%",
        _cursor("approvals", "2026-01-01T00:00:00+00:00", 5),  # another list's
        _cursor("runs", "2026-01-01T00:00:00", "r"),  # no time zone
        _cursor("runs", "2026-01-01T00:00:00+00:00", 5),  # runs are keyed by text
        _cursor("runs", "2026-01-01T00:00:00+00:00", "a\u0000b"),
        _cursor("runs", "yesterday", "r"),
        _cursor("runs"),
    ],
)
def test_a_bad_cursor_is_refused(cursor):
    error(staff_with().get("/runs", cursor=cursor), 400, "request.cursor")


def test_cursor_and_offset_together_are_refused():
    _runs(3)
    caller = staff_with()
    cursor = caller.get("/runs", limit=1).json()["next_cursor"]
    error(caller.get("/runs", cursor=cursor, offset=1), 400, "request.cursor")
    big = _cursor("approvals", "2026-01-01T00:00:00+00:00", 2**70)
    error(
        staff_with("durable_agents.view_approvalrequest", name="a2").get("/approvals", cursor=big),
        400,
        "request.cursor",
    )
