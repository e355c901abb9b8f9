"""The approver's inbox (``/admin/durable_agents/inbox/``, URL name
``admin:durable_agents_inbox``): one card per thing waiting on a person — a call awaiting
approval, a question, a halt — the longest waiting first, each with what it needs to be
decided right: the tool's summary and description, the arguments rendered for a person
(``rendered``), the model's stated reason, the run, its root and the path of sub-runs
between, the quorum and who voted.

A card whose arguments are folded offers no decision: "Show all to decide" opens it whole
(a link: no JavaScript needed), and only then are Approve / Deny there. A decision posted
from the inbox must carry the arguments its card showed whole, or it is refused and
nothing is written. Deciding, answering and resolving go through the same views (and the
same engine commands) as the queues' pages.

Each call's card says which approval rule asked about it and why, who decides it, and its
deadline (``rule_state``, read from the request row against the database's clock). The
filters *escalated to me* (``assigned``) and *delegated to me* (calls this person may decide
only as the deputy of an approver who may: ``deciding.ways_by_row``, the engine's one rule)
narrow the calls to those that wait on this person in particular.

Glue only: reads the queue tables and, for the cards shown, their runs' model turns and
wait records, in a fixed number of queries (a card deep in a tree adds one per ancestor run
to draw its path).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import urlencode

from ..database import reads
from ..database.reads import asking_live, wait_records
from ..engine.errors import DurableAgentsError
from ..engine.ports import (
    APPROVAL_PENDING,
    AWAITING_INPUT,
    HALT_EXPIRED,
    HALT_OPEN,
    IMPORTED_INERT,
)
from ..engine.views import Record, kind_of
from ..engine.waits import INTERRUPT
from ..models import ApprovalRequest, Decision, Delegation, Halt, Inbox, Run
from ..people_keys import pending_for
from ..rule_state import rule_state
from .assigned import escalated_to
from .base import AnyModelAdmin, ReadOnlyAdmin, admin_actor, allows, page, related_count
from .deciding import progress, shown_arguments, ways_by_row
from .paging import CAP, counted
from .readable import edit_changes, origin_of, stated_reason, summary_of, tool_of
from .rendered import identifying_of, render
from .waits import question_slug, waits_of_run

INBOX_SIZE = 100  # cards of each kind read; the page says how many more wait


@dataclass(frozen=True)
class Filters:
    """Which cards: the inbox's filters, or (the run page's banner) the runs of one subtree.
    ``back``: where a decision made on a card returns (``inbox`` or ``run``). ``escalated``
    and ``delegated`` keep only calls (no questions, no halts): those escalated to a group
    of mine, and those I may decide only for an approver who delegated to me."""

    agent: str = ""
    tool: str = ""
    mine: bool = False
    escalated: bool = False
    delegated: bool = False
    runs: frozenset[str] | None = None
    back: str = "inbox"

    def apply(self, rows: QuerySet[Any]) -> QuerySet[Any]:
        """``rows`` (approval requests or halts) narrowed to these runs, agent and tool."""
        if self.runs is not None:
            rows = rows.filter(run_id__in=self.runs)
        if self.agent:
            rows = rows.filter(run__agent=self.agent)
        if self.tool:
            rows = rows.filter(tool_name=self.tool)
        return rows

    @classmethod
    def of(cls, request: HttpRequest) -> Filters:
        return cls(
            agent=str(request.GET.get("agent") or ""),
            tool=str(request.GET.get("tool") or ""),
            mine=request.GET.get("mine") == "1",
            escalated=request.GET.get("escalated") == "1",
            delegated=request.GET.get("delegated") == "1",
        )

    @property
    def calls_only(self) -> bool:
        return self.escalated or self.delegated

    @property
    def any(self) -> bool:
        return bool(self.agent or self.tool or self.mine or self.calls_only)


def waited(since: datetime | None, now: datetime) -> str:
    """``"3 h 12 min"``: how long something has waited, in the two largest units."""
    if since is None:
        return ""
    seconds = max(0, int((now - since).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min"
    return f"{seconds} s"


def _run_url(run_id: str) -> str:
    return reverse("admin:durable_agents_run_change", args=[quote(run_id)])


class _Runs:
    """What the cards need of their runs, read in a few queries whatever the number of
    cards: the path from each root (``Run`` rows, cached), the model turns of the runs with
    calls awaiting approval (for the model's stated reason) and the wait records of the runs
    awaiting input (for their questions)."""

    def __init__(self) -> None:
        self._rows: dict[str, Run | None] = {}
        self._turns: dict[str, list[Record]] = {}

    def row(self, run_id: str) -> Run | None:
        if run_id not in self._rows:
            self._rows[run_id] = Run.objects.filter(run_id=run_id).first()
        return self._rows[run_id]

    def path(self, run: Run) -> list[dict[str, str]]:
        """The runs from the root down to ``run``'s parent (empty for a root run)."""
        out: list[dict[str, str]] = []
        parent = run.parent_run_id
        while parent and len(out) < 20:
            out.insert(0, {"run_id": parent, "url": _run_url(parent)})
            row = self.row(parent)
            parent = row.parent_run_id if row is not None else None
        return out

    def read_turns(self, run_ids: Iterable[str]) -> None:
        """The model turns of ``run_ids``, in one query."""
        wanted = [r for r in set(run_ids) if r not in self._turns]
        for run_id in wanted:
            self._turns[run_id] = []
        for run_id, turns in reads.model_turns(wanted).items():
            self._turns[run_id].extend(turns)

    def stated_reason(self, run_id: str, call_id: str) -> str:
        try:
            return stated_reason(self._turns.get(run_id, []), call_id)
        except DurableAgentsError:  # a record that cannot be read: no reason shown
            return ""


def _where(runs: _Runs, run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "run_url": _run_url(run.run_id),
        "agent": run.agent,
        "path": runs.path(run),
    }


def _whole_url(request: HttpRequest, card_id: str) -> str:
    query = request.GET.copy()
    opened = query.getlist("whole")
    query.setlist("whole", [*opened, card_id] if card_id not in opened else opened)
    return f"{request.path}?{query.urlencode()}#{card_id}"


# -- the cards ------------------------------------------------------------------------------


def approval_cards(
    request: HttpRequest, filters: Filters, runs: _Runs, now: datetime
) -> tuple[list[dict[str, Any]], int]:
    rows = filters.apply(
        ApprovalRequest.objects.filter(status=APPROVAL_PENDING)
        .exclude(run__imported=IMPORTED_INERT)
        .select_related("run")
    )
    actor = admin_actor(request)
    if filters.escalated:
        rows = escalated_to(rows, actor.groups or ())
    total, _ = counted(rows)
    rows = rows.annotate(
        n_approved=related_count(Decision, "request", approved=True),
        n_denied=related_count(Decision, "request", approved=False),
        db_now=Now(),  # deadlines are counted on the database's clock, as the sweep does
    ).order_by("created_at", "pk")
    page_rows = list(
        rows.prefetch_related(Prefetch("decisions", Decision.objects.order_by("created_at")))[
            :INBOX_SIZE
        ]
    )

    # which import this module

    may_decide = allows(request, "decide")
    ways = ways_by_row(request, page_rows) if may_decide else {}
    runs.read_turns(obj.run_id for obj in page_rows)
    username = actor.username
    whole = set(request.GET.getlist("whole"))
    cards = []
    for obj in page_rows:
        card_id = f"approval-{obj.pk}"
        tool = tool_of(obj)
        shown = render(
            getattr(tool, "parameters", None),
            obj.arguments,
            whole=card_id in whole,
            first=identifying_of(tool),
        )
        votes = list(obj.decisions.all())
        # Voted for themselves, or for someone as their deputy: a person counts once.
        voted = any(username in (v.approver, v.deputy) for v in votes)
        way = ways.get(obj.pk)
        eligible = may_decide and not voted and way is not None and not way.refused
        # Whom they decide it for as a deputy (engine.delegation): nobody, when they may
        # decide it in their own right.
        delegated = list(way.delegations) if eligible and way is not None else []
        if filters.mine and not eligible:
            continue
        if filters.delegated and not delegated:
            continue
        state = rule_state(obj)
        call_url = reverse("admin:durable_agents_approvalrequest_change", args=[obj.pk])
        cards.append(
            {
                "kind": "approval",
                "id": card_id,
                "back": filters.back,
                "since": obj.created_at,
                "waited": waited(obj.created_at, now),
                "tool": obj.tool_name,
                "call_id": obj.call_id,
                "description": getattr(tool, "description", "") or "",
                "origin": origin_of(tool),
                "tool_missing": tool is None,
                "summary": summary_of(tool, obj.arguments),
                "shown": shown,
                "shown_json": shown_arguments(obj),  # what the decision is for
                # What its decision bar names: the arguments that identify the call.
                "covers": [f for f in shown.fields if f.identifying],
                "reason": runs.stated_reason(obj.run_id, obj.call_id),
                **_where(runs, obj.run),
                "progress": progress(obj.policy, obj.n_approved, obj.n_denied),
                "rule": state,
                "changes": edit_changes(tool, obj.arguments, state.moved_arguments)
                if state.moved
                else [],
                "delegated": delegated,
                "votes": votes,
                "voted": voted,
                "may_decide": eligible,
                # Delegated to this person: whom they decide for (engine.delegation).
                "deciding_for": list(way.for_approvers) if eligible and way else [],
                "editable": eligible and tool is not None and tool.safety.editable,
                "edit_url": f"{call_url}#da-decide"
                if eligible and tool is not None and tool.safety.editable
                else "",
                "asked_again": obj.previous_arguments is not None,
                "decide_url": reverse("admin:durable_agents_approvalrequest_decide", args=[obj.pk]),
                "call_url": call_url,
                "whole_url": _whole_url(request, card_id),
            }
        )
    return cards, total


def question_cards(
    admin: AnyModelAdmin, request: HttpRequest, filters: Filters, runs: _Runs, now: datetime
) -> tuple[list[dict[str, Any]], int]:
    if filters.calls_only or (filters.mine and not allows(request, "answer")):
        return [], 0
    run_admin = admin.admin_site.get_model_admin(Run)  # its answer URLs serve the cards
    rows = Run.objects.filter(Q(status=AWAITING_INPUT) | asking_live()).exclude(
        imported=IMPORTED_INERT
    )
    if filters.runs is not None:
        rows = rows.filter(run_id__in=filters.runs)
    if filters.agent:
        rows = rows.filter(agent=filters.agent)
    total, _ = counted(rows)
    page_runs = list(rows.order_by("updated_at")[:INBOX_SIZE])
    recorded = wait_records([r.run_id for r in page_runs])  # one query for the page
    cards = []
    for run in page_runs:
        records = recorded[run.run_id]
        asked = {
            str(r.get("name")): r.created_at
            for r in records
            if kind_of(r.name)[0] == "wait" and r.get("kind") == INTERRUPT
        }
        waits = waits_of_run(run_admin, request, run, records)
        for q in waits["questions"]:
            wait = q["wait"]
            if filters.tool and wait.tool != filters.tool:
                continue
            since = asked.get(wait.name) or run.updated_at
            card_id = f"question-{question_slug(run.run_id, wait.name)}"
            cards.append(
                {
                    "kind": "question",
                    "id": card_id,
                    "back": filters.back,
                    "since": since,
                    "waited": waited(since, now),
                    "tool": wait.tool,
                    "call_id": wait.call_id,
                    "name": wait.name,
                    "prompt": wait.prompt,
                    "form": q["form"],
                    "shown_prompt": q["shown"],
                    "answer_url": q["url"],
                    **_where(runs, run),
                }
            )
    return cards, total


def halt_cards(
    request: HttpRequest, filters: Filters, runs: _Runs, now: datetime
) -> tuple[list[dict[str, Any]], int]:
    if filters.calls_only or (filters.mine and not allows(request, "resolve")):
        return [], 0
    rows = filters.apply(
        Halt.objects.filter(status=HALT_OPEN)
        .exclude(run__imported=IMPORTED_INERT)
        .select_related("run")
    )
    total, _ = counted(rows)
    whole = set(request.GET.getlist("whole"))
    cards = []
    for halt in rows.order_by("created_at", "pk")[:INBOX_SIZE]:
        card_id = f"halt-{halt.pk}"
        tool = tool_of(halt)
        reason = halt.reason if isinstance(halt.reason, dict) else None
        cards.append(
            {
                "kind": "halt",
                "id": card_id,
                "back": filters.back,
                "since": halt.created_at,
                "waited": waited(halt.created_at, now),
                "tool": halt.tool_name,
                "call_id": halt.op_id,
                "description": getattr(tool, "description", "") or "",
                "origin": origin_of(tool),
                "cause": halt.get_cause_display(),
                "expired": halt.cause == HALT_EXPIRED,
                "reason": reason,
                "shown": render(
                    getattr(tool, "parameters", None),
                    halt.arguments,
                    whole=card_id in whole,
                    first=identifying_of(tool),
                ),
                "attempted_at": halt.attempted_at,
                "halt_url": reverse("admin:durable_agents_halt_change", args=[halt.pk]),
                "whole_url": _whole_url(request, card_id),
                **_where(runs, halt.run),
            }
        )
    return cards, total


# -- the page -------------------------------------------------------------------------------


def subtree(run: Run) -> list[str]:
    """``run`` and every sub-run below it (from the tree's rows, one query), parents first."""
    root = run.root_run_id or run.run_id
    children: dict[str, list[str]] = {}
    for run_id, parent in Run.objects.filter(root_run_id=root).values_list(
        "run_id", "parent_run_id"
    ):
        if parent:
            children.setdefault(parent, []).append(run_id)
    out: list[str] = []
    todo = [run.run_id]
    while todo and len(out) < 10_000:
        here = todo.pop(0)
        out.append(here)
        todo.extend(sorted(children.get(here, ())))
    return out


def banner_cards(admin: AnyModelAdmin, request: HttpRequest, run: Run) -> list[dict[str, Any]]:
    """The run page's banner: the cards of what waits on a person in ``run`` and in the
    sub-runs below it (a root waiting on a sub-run's approval shows that approval first),
    longest waiting first. The run's own questions are asked by the page's answer forms."""
    # Who sees the run page sees its halts (its halts panel lists them too).
    see_approvals, see_questions, _ = _sees(request)
    below = subtree(run)
    now = timezone.now()
    runs = _Runs()
    cards: list[dict[str, Any]] = []
    if see_approvals:
        cards += approval_cards(request, Filters(runs=frozenset(below), back="run"), runs, now)[0]
    if see_questions and len(below) > 1:
        scope = Filters(runs=frozenset(below[1:]), back="run")
        cards += question_cards(admin, request, scope, runs, now)[0]
    cards += halt_cards(request, Filters(runs=frozenset(below), back="run"), runs, now)[0]
    cards.sort(key=lambda c: (c["since"] is None, c["since"] or now))
    return cards


def _options(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v})


def _sees(request: HttpRequest) -> tuple[bool, bool, bool]:
    """Which kinds of card the user may see: approvals, questions, halts (the permission
    that reads each queue, or the one that acts on it)."""
    return (
        allows(request, "view_approvals") or allows(request, "decide"),
        allows(request, "view_runs") or allows(request, "answer"),
        allows(request, "view_halts") or allows(request, "resolve"),
    )


def inbox_view(admin: AnyModelAdmin, request: HttpRequest) -> HttpResponse:
    see_approvals, see_questions, see_halts = _sees(request)
    if not (see_approvals or see_halts or see_questions):
        raise PermissionDenied
    filters = Filters.of(request)
    now = timezone.now()
    runs = _Runs()
    cards: list[dict[str, Any]] = []
    more = 0
    agents: list[str] = []
    tools: list[str] = []
    if see_approvals:
        got, total = approval_cards(request, filters, runs, now)
        cards += got
        more += max(0, total - INBOX_SIZE)
        pending = ApprovalRequest.objects.filter(status=APPROVAL_PENDING).exclude(
            run__imported=IMPORTED_INERT
        )
        agents += pending.values_list("run__agent", flat=True).distinct()
        tools += pending.values_list("tool_name", flat=True).distinct()
    if see_questions:
        got, total = question_cards(admin, request, filters, runs, now)
        cards += got
        more += max(0, total - INBOX_SIZE)
        agents += (
            Run.objects.filter(Q(status=AWAITING_INPUT) | asking_live())
            .exclude(imported=IMPORTED_INERT)
            .values_list("agent", flat=True)
        )
        tools += [c["tool"] for c in got]
    if see_halts:
        got, total = halt_cards(request, filters, runs, now)
        cards += got
        more += max(0, total - INBOX_SIZE)
        open_ = Halt.objects.filter(status=HALT_OPEN).exclude(run__imported=IMPORTED_INERT)
        agents += open_.values_list("run__agent", flat=True).distinct()
        tools += open_.values_list("tool_name", flat=True).distinct()
    cards.sort(key=lambda c: (c["since"] is None, c["since"] or now))
    here = request.get_full_path()
    return page(
        admin,
        request,
        "admin/durable_agents/inbox.html",
        "Inbox: waiting on a person",
        {
            "cards": cards,
            "more": more,
            # A kind counted up to the cap has more waiting than the count says.
            "more_capped": more >= CAP - INBOX_SIZE,
            "filters": filters,
            "agents": _options(agents),
            "tools": _options(tools),
            "filtered": filters.any,
            "clear_url": request.path,
            "here": here,
            "back": urlencode({"back": "inbox"}),
            # Approver keys a superuser registered for this person: inert until confirmed.
            "pending_keys": list(pending_for(request.user)[0][:20]),
            # In force now, naming this person: whom they decide for, who decides for them.
            "delegations": _delegations(request) if see_approvals else [],
        },
    )


def _delegations(request: HttpRequest) -> list[Delegation]:
    return reads.delegations_naming(request.user.get_username())


@admin.register(Inbox)
class InboxAdmin(ReadOnlyAdmin):
    """The inbox page in place of a change list (the model is a proxy: nothing to list)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return any(_sees(request))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return any(_sees(request))

    def get_urls(self) -> list[URLPattern]:
        return [path("", self._view(inbox_view), name="durable_agents_inbox"), *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return inbox_view(self, request)
