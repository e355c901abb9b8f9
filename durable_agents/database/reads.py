"""What the admin and the API read, on the site's database: the one door into this package
for pages and endpoints.

What a list page reads here costs a fixed number of queries whatever the page size (the
query-plan tests count them); what the records say is decoded by ``engine.views`` and the
engine's readers (``waits``, ``session_log``, ``transcript``), never in a page. The rows
the pages list themselves (runs, requests, halts) are read from ``models`` as before; what
lives in the journal is read only here.

* ``journal`` — a run's records in commit order (one query), for its timeline and the API.
* ``starts`` — each run's ``run:start`` (``engine.views.Start``), for a page of runs.
* ``children`` — the sub-runs a run's calls started (``engine.views.Child``).
* ``model_turns`` — the model turns of some runs (for the reason a model gave for a call).
* ``wait_records``, ``asking_live`` — what runs wait for (``engine.waits`` reads it), and
  the running runs a live MCP call asked a question of.
* ``session`` — a session's agent and log (``engine.session_log.SessionLog``).
* ``delegations_in_force``, ``delegations_to`` — the delegations in force for some
  approvers, or to a deputy, by the database's clock; ``with_state``/``in_state`` for
  the delegation lists.
* ``run_info``, ``runs_below``, ``rows_of_runs`` — a run as the engine sees it, the runs
  below it, and the rows a delete takes with it.
* ``verify``, ``sign_head``, ``import_trust`` — the run's audit check (``database.audit``).
* ``sse_response``/``last_event_id`` — a run's live events (``database.events``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q

from ..engine import names
from ..engine import tree as engine_tree
from ..engine.delegation import in_force_to
from ..engine.journal import Journal
from ..engine.ports import RUNNING, DelegationInfo, LeaseInfo, RunInfo
from ..engine.session_log import SessionLog
from ..engine.views import Child, Record, Start, session_journal
from ..mcp.elicitation import PREFIX as LIVE_PREFIX
from ..models import ApprovalRequest, Delegation, Halt, JournalEntry, Lease
from .audit import import_trust, sign_head, verify
from .delegations import (
    ENDED,
    IN_FORCE,
    REVOKED,
    UPCOMING,
    in_force_now,
    in_state,
    to_domain,
    with_state,
)
from .events import last_event_id, sse_response
from .limits import LimitQueue, limit_queues
from .store import site_store

__all__ = [
    "ENDED",
    "IN_FORCE",
    "REVOKED",
    "UPCOMING",
    "LimitQueue",
    "SessionRead",
    "asking_live",
    "children",
    "delegations_in_force",
    "delegations_naming",
    "delegations_to",
    "import_trust",
    "in_state",
    "journal",
    "last_event_id",
    "lease",
    "limit_queues",
    "model_turns",
    "rows_of_runs",
    "run_info",
    "runs_below",
    "session",
    "session_agent",
    "sign_head",
    "sse_response",
    "starts",
    "verify",
    "wait_records",
    "with_state",
]


def journal(run_id: str) -> list[Record]:
    """Every record of the run in commit order, the header first, in one read."""
    return Journal(site_store()).records(run_id)


def lease(run_id: str) -> LeaseInfo | None:
    """The run's lease as it stands (one query), or None when no driver holds it."""
    return site_store().get_lease(run_id)


def run_info(run_id: str) -> RunInfo | None:
    """The run as the engine sees it (one query), or None when there is no such run."""
    return site_store().get_run(run_id)


def runs_below(run_id: str) -> list[str]:
    """Every run below ``run_id`` that is its tree's own (``engine.tree.runs_below``)."""
    return engine_tree.runs_below(site_store(), run_id)


def rows_of_runs(run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """How many journal entries, approval requests, halts and leases each run has (what a
    delete takes with it): one query per kind of row, whatever the number of runs."""
    related: list[tuple[Any, str]] = [
        (JournalEntry, "journal entries"),
        (ApprovalRequest, "approval requests"),
        (Halt, "halts"),
        (Lease, "leases"),
    ]
    counts: dict[str, dict[str, int]] = {}
    for model, label in related:
        rows = (
            model._default_manager.filter(run_id__in=run_ids)
            .values("run_id")
            .annotate(n=Count("pk"))
        )
        counts[label] = {r["run_id"]: r["n"] for r in rows}
    return counts


def starts(run_ids: Iterable[str]) -> dict[str, Start]:
    """Each run's current ``run:start``, in one query (a run without one is left out)."""
    rows = JournalEntry.objects.filter(run_id__in=set(run_ids), name=names.RUN_START).values_list(
        "run_id", "seq", "data"
    )
    found = {}
    for run_id, seq, data in rows:
        start = Start.of_row(run_id, seq, data)
        if start is not None:
            found[run_id] = start
    return found


def children(run_id: str) -> list[Child]:
    """The sub-runs the run's calls started, in commit order, in one query."""
    rows = JournalEntry.objects.filter(run_id=run_id, name__startswith=names.CHILD).values_list(
        "name", "data"
    )
    return [Child.of(name[len(names.CHILD) :], data) for name, data in rows]


@dataclass(frozen=True)
class SessionRead:
    """A session as its journal run records it: the agent it talks to, and its log."""

    session_id: str
    agent: str
    log: SessionLog


def session_agent(session_id: str) -> str | None:
    """The agent a session talks to, or None for a session not opened yet (one query)."""
    row = site_store().get_run(session_journal(session_id))
    return row.agent if row is not None else None


def session(session_id: str) -> SessionRead | None:
    """The session's agent and log (two reads), or None when there is no such session."""
    store = site_store()
    journal_id = session_journal(session_id)
    row = store.get_run(journal_id)
    if row is None:
        return None
    return SessionRead(session_id, row.agent, SessionLog.of(Journal(store).records(journal_id)))


_WAIT_RECORDS = (
    names.WAIT,
    names.INPUT,
    names.SIGNAL,
    names.WAITED,
    names.RECEIVING,
    names.MESSAGE,
    names.ACK,
)


def wait_records(run_ids: Sequence[str]) -> dict[str, list[Record]]:
    """The wait records (requests, answers, signals, resolutions, channel messages, acks and
    receives) of ``run_ids``, in one query, in commit order per run (``engine.waits`` reads
    them)."""
    prefixes = Q()
    for prefix in _WAIT_RECORDS:
        prefixes |= Q(name__startswith=prefix)
    rows = (
        JournalEntry.objects.filter(prefixes, run_id__in=list(run_ids))
        .order_by("seq")
        .values_list("run_id", "name", "seq", "data", "created_at")
    )
    out: dict[str, list[Record]] = {run_id: [] for run_id in run_ids}
    for run_id, name, seq, data, at in rows:
        out[run_id].append(Record(run_id, name, seq, data, at))
    return out


def model_turns(run_ids: Sequence[str]) -> dict[str, list[Record]]:
    """The model turns of ``run_ids``, in one query, in commit order per run (a run without
    any is left out)."""
    rows = (
        JournalEntry.objects.filter(run_id__in=list(run_ids), name__startswith=names.MODEL)
        .order_by("seq")
        .values_list("run_id", "name", "seq", "data", "created_at")
    )
    out: dict[str, list[Record]] = {}
    for run_id, name, seq, data, at in rows:
        out.setdefault(run_id, []).append(Record(run_id, name, seq, data, at))
    return out


def asking_live() -> Q:
    """Running runs whose MCP call asked staff a question (an elicitation: a live question,
    answered while the call waits; docs/mcp.md). An index probe per running run."""
    asked = JournalEntry.objects.filter(
        run_id=OuterRef("run_id"), name__startswith=names.wait(LIVE_PREFIX)
    )
    return Q(status=RUNNING) & Q(Exists(asked))


def delegations_to(deputy: str) -> list[DelegationInfo]:
    """The delegations to ``deputy`` in force now, by the database's clock (one query)."""
    return in_force_to(site_store(), deputy)


def delegations_naming(username: str, limit: int = 20) -> list[Delegation]:
    """The delegations in force now that name ``username`` as deputy or as approver, the
    first to end first (one query)."""
    rows = Delegation.objects.filter(in_force_now()).filter(
        Q(deputy=username) | Q(approver=username)
    )
    return list(rows.order_by("ends_at", "pk")[:limit])


def delegations_in_force(approvers: Iterable[str]) -> list[DelegationInfo]:
    """The delegations in force now for ``approvers``, by the database's clock (one query;
    none without approvers)."""
    wanted = set(approvers)
    if not wanted:
        return []
    return [to_domain(d) for d in Delegation.objects.filter(in_force_now(), approver__in=wanted)]
