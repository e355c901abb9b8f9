"""Limits: how many runs of an agent are driven at once, how many calls of a tool run at
once, and how often a tool or a model provider is called (docs/limits.md).

Every limit is held in the store, so it holds across every worker and process:

* **A slot** (``Agent(max_concurrent_runs=N)``, ``@tool(max_concurrent=N)``) is a row naming
  the run's lease token. It counts only while that lease is live — unexpired by the store's
  clock and, with instant takeover, held by a living process — so a driver that dies frees
  its slots with its lease: nothing to leak, nothing to clean up by hand. A run takes its
  agent's slot when it is about to call the model or a tool (a drive that only finds an
  approval still pending takes none) and gives it back when the drive ends; a tool's slot
  is held from just before the call's attempt claim until its result is recorded.
* **A rate** (``@tool(rate="10/s")``, ``DURABLE_AGENTS["MODEL_RATES"]``) is a GCRA bucket: one
  row per key holding the theoretical arrival time of the next permit. A permit is taken
  only when granted; a refusal takes nothing and says when the next one frees.

A run that must wait is **throttled**: it lets go of its lease and its slots, its row says
``throttled``, and a ``throttle`` row says what it waits for and when it tries again. It is
handed over at that time (the Celery message the pause schedules, or the sweep), or sooner
when a slot of the key it waits for is given back. Throttling writes nothing to the journal:
it is scheduling, not a step of the run; nothing recorded is repeated by waiting. A throttled
call has no attempt claim yet, so its retry is the call's first attempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .errors import ConfigError

_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*")
_UNIT = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_UNIT |= {"h": 3600, "hour": 3600, "d": 86400, "day": 86400}

# Waiting for a slot: tried again after 1, 2, 4… seconds, at most this long apart (a slot
# given back hands the oldest waiter over at once; this covers a slot freed by a death).
SLOT_RETRY_MAX = 30.0
# A run throttled again on the same key within this many seconds of its retry time is still
# in the same wait (its tries go on counting, its ``since`` stays).
CONTINUED_WAIT = 60.0


@dataclass(frozen=True)
class Rate:
    """``count`` permits per ``period`` seconds, a burst of ``count`` allowed."""

    count: int
    period: float
    text: str

    @property
    def interval(self) -> float:
        return self.period / self.count


def parse_rate(text: Any, what: str) -> Rate:
    """``"10/s"``, ``"500/m"``, ``"1000/h"``, ``"5/d"``, ``"3/10s"`` → ``Rate``; anything else
    is a ``ConfigError`` naming ``what`` it was for."""
    m = _RATE.fullmatch(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) < 1 or m.group(2) in ("0",):
        raise ConfigError(
            f"{what}: rate {text!r} is not a rate; write it as count/period, e.g. '10/s', "
            "'500/m', '1000/h' or '3/10s'",
            code="config.rate",
        )
    period = int(m.group(2) or 1) * _UNIT[m.group(3)]
    return Rate(int(m.group(1)), float(period), text.strip())


def check_limit(value: Any, what: str) -> int | None:
    """A concurrency limit: None (no limit) or an int of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be an int of at least 1, or None", code="config.limit")
    return value


def agent_key(agent: str) -> str:
    return f"agent/{agent}"


def tool_key(tool: str) -> str:
    return f"tool/{tool}"


def model_key(provider: str) -> str:
    return f"model/{provider}"


def model_names(model: Any) -> list[str]:
    """The names a site's ``MODEL_RATES`` may know a model by, most specific first: its
    ``model_id`` (``"openai:gpt-4o"``), then its adapter's ``provider`` (``"openai"``)."""
    found = [getattr(model, "model_id", None), getattr(model, "provider", None)]
    return [n for n in found if isinstance(n, str) and n]


@dataclass(frozen=True)
class Refusal:
    """Why a run must wait: the key whose limit is full, and when to try again."""

    key: str
    retry_at: datetime
    reason: str  # "slots" or "rate"
    limit: str  # what the limit is, for people: "3 at once", "10/s"


def continued(old: Any, info: Any) -> tuple[int, datetime]:
    """The tries and ``since`` of a throttle ``info`` replacing the run's ``old`` one (a
    ``ThrottleInfo`` or a row, or None): the same wait goes on when it is on the same key and
    the run was throttled again about when it was to retry; else a new wait begins."""
    if (
        old is not None
        and old.key == info.key
        and (info.since - old.retry_at).total_seconds() <= CONTINUED_WAIT
    ):
        return int(old.tries) + 1, old.since
    return 1, info.since


def slot_retry(now: datetime, tries: int) -> datetime:
    return now + timedelta(seconds=min(SLOT_RETRY_MAX, 2.0 ** max(0, tries)))
