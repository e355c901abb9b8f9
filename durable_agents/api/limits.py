"""Limits: each agent's, tool's and model provider's limit with its slots in use and the
runs waiting on it (docs/limits.md)."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Router, Schema

from ..conf import get_settings
from ..database.reads import limit_queues
from .auth import check
from .schemas import ERRORS

router = Router(tags=["limits"])


class LimitOut(Schema):
    key: str
    kind: str
    name: str
    limit: str
    in_use: int | None
    waiting: int
    oldest_since: datetime | None
    next_retry_at: datetime | None


class LimitList(Schema):
    items: list[LimitOut]


@router.get("/limits", response={200: LimitList, **ERRORS})
def list_limits(request: HttpRequest) -> LimitList:
    """Every declared limit (``Agent(max_concurrent_runs=…)``, ``@tool(rate=…,
    max_concurrent=…)``, ``MODEL_RATES``) and every key a throttled run waits on: the slots in
    use now (null for a rate) and the runs waiting, the oldest wait and the next retry.
    Needs ``view_run``."""
    check(request, "view_runs")
    queues = limit_queues(get_settings().database)
    return LimitList(items=[LimitOut(**q.to_json()) for q in queues])
