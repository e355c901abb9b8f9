"""Deciding gated calls from the admin: one call (its page, the run page's banner, the
queue's inline buttons) or several at once (the queue's "Approve selected" / "Deny selected"
actions, confirmed on a page that lists exactly what will run).

Every path decides each call through the engine's ``approve`` command, so the permission
table, the quorum rules (a person counts once) and the action log are the same ones. A bulk
decision first checks that the person may decide every selected call; if one is refused,
nothing at all is decided. A call whose quorum is not met after this person's vote stays
pending, and the result page says so on its row. (No policy requires a signature today; a
signed decision is made through the API, never here.)

A person who may not decide a call themselves but is the deputy of an approver who may
(``engine.delegation``) decides it for them: the call's page and its card say for whom, and
post it (``for_approver``); of several, the page lets them choose, and a bulk decision
refuses the row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from ..celery.dispatch import deferred
from ..database import reads
from ..engine import runtime
from ..engine.approvals import NOT_SHOWN, resolve_approver
from ..engine.commands.approvals import approve
from ..engine.delegation import choices
from ..engine.errors import ApprovalEditInvalid, DurableAgentsError
from ..engine.ports import APPROVAL_PENDING
from ..models import ApprovalRequest, Decision
from .base import BY_RECOVERY, AnyModelAdmin, admin_actor, not_handed_over, page, run_url
from .readable import fields_of, summary_of, tool_of

NOTE_MAX = 2000


@dataclass(frozen=True)
class Decided:
    """What one decision did: ``decided`` (the call is approved or denied now), ``pending``
    (recorded; the quorum is not met yet), ``unchanged`` (the same decision again: the
    standing one), ``refused`` (an engine refusal, nothing written) or ``not_handed_over``
    (recorded, but the broker could not be reached)."""

    kind: str
    text: str


def progress(policy: Any, approvals: int, denials: int) -> str:
    """``"1 of 2 approved"`` (quorum) or ``"0 of 1 approved"`` (single)."""
    policy = policy if isinstance(policy, dict) else {}
    quorum = policy.get("kind") == "quorum"
    need = int(policy.get("need", 1)) if quorum else 1
    text = f"{approvals} of {need} approved"
    if denials:
        text += f", {denials} denied"
    if quorum:
        text += f" (group {policy.get('group')})"
    return text


def shown_arguments(obj: ApprovalRequest) -> str:
    """The arguments a decision form shows, as it posts them back (``shown``): the decision
    is for those, and the engine refuses it (``approval.arguments_changed``) if the call
    asks about others by the time it is submitted."""
    return json.dumps(obj.arguments, ensure_ascii=False, sort_keys=True)


def decide_call(
    request: HttpRequest,
    obj: ApprovalRequest,
    approved: bool,
    note: str = "",
    *,
    edit: Any = None,
    arguments: Any = NOT_SHOWN,
    for_approver: str | None = None,
) -> Decided:
    """Decide ``obj`` as the signed-in user through ``approve`` (for ``for_approver``, as
    their deputy). An invalid edit raises ``ApprovalEditInvalid`` (a form error for the
    caller; nothing written)."""
    try:
        with deferred() as late:
            outcome = approve(
                obj.run_id,
                obj.call_id,
                approved,
                by=admin_actor(request),
                note=note,
                edit=edit,
                arguments=arguments,
                for_approver=for_approver or None,
            )
    except ApprovalEditInvalid:
        raise
    except DurableAgentsError as exc:
        return Decided("refused", f"{exc} [{exc.code}]")
    if late:  # recorded, and the run queued; only the message to a worker failed
        recorded = f"Call {obj.call_id} of run {obj.run_id} is {outcome.status} (recorded)"
        not_handed_over(request, recorded, late[0].error, BY_RECOVERY)
        return Decided("not_handed_over", f"{recorded}; {BY_RECOVERY}")
    if obj.status != APPROVAL_PENDING:  # the same decision again: the standing one
        return Decided(
            "unchanged", f"Call {obj.call_id} was already {outcome.status}; nothing changed."
        )
    if outcome.status == APPROVAL_PENDING:
        tally = outcome.tally
        return Decided(
            "pending",
            f"Your decision{f' for {for_approver}' if for_approver else ''} on call "
            f"{obj.call_id} is recorded: "
            f"{len(tally.get('approved_by') or ())} of {tally.get('need')} approved so far.",
        )
    return Decided(
        "decided",
        f"Call {obj.call_id} of run {obj.run_id} is {outcome.status}; the run was handed to a "
        "driver.",
    )


def tell(request: HttpRequest, decided: Decided) -> None:
    """Say on the next page what one decision did (a failed hand-over has said so already)."""
    if decided.kind == "refused":
        messages.error(request, decided.text)
    elif decided.kind == "unchanged":
        messages.info(request, decided.text)
    elif decided.kind in ("decided", "pending"):
        messages.success(request, decided.text)


# -- several at once ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ways:
    """How this person may decide one call: not at all (``refused`` says why), as
    themselves (``for_approvers`` empty), or for one of ``for_approvers`` as their deputy."""

    refused: str = ""
    for_approvers: tuple[str, ...] = ()
    # The delegations in force that let them, in the same order (when each ends).
    delegations: tuple[Any, ...] = ()


def ways_by_row(request: HttpRequest, rows: Sequence[ApprovalRequest]) -> dict[int, Ways]:
    """How this person may decide each of ``rows`` (the engine's one rule,
    ``check_may_decide``, through ``engine.delegation.choices``), by primary key. One query
    per deciding group on the page, one for the delegations in force to this person (only
    if they may not decide some call themselves) and a few per approver they may decide
    for, whatever the number of rows; the rows' decisions are read from their prefetch."""
    try:
        actor = resolve_approver(admin_actor(request))
    except DurableAgentsError as exc:
        return {obj.pk: Ways(f"{exc} [{exc.code}]") for obj in rows}
    groups: dict[str, list[str]] = {}
    delegations: list[Any] = []
    people: dict[str, Any] = {}

    def members(group: str) -> list[str]:  # once per group on the page
        if group not in groups:
            groups[group] = list(runtime.eligible_approvers(group))
        return groups[group]

    def in_force() -> list[Any]:  # once per page, when needed
        if not delegations:
            delegations.append(reads.delegations_to(actor.username))
        return list(delegations[0])

    def resolve(name: str) -> Any:  # once per approver on the page
        if name not in people:
            people[name] = resolve_approver(name)
        return people[name]

    out = {}
    for obj in rows:
        policy = obj.policy if isinstance(obj.policy, dict) else {}
        found, own = choices(
            actor,
            obj.to_domain(),
            policy,
            delegations=in_force,
            voted=_voted(obj),
            members=members,
            resolve=resolve,
        )
        if not found:
            assert own is not None
            out[obj.pk] = Ways(f"{own} [{own.code}]")
        elif found[0].deputy:
            names = tuple(d.approver.username for d in found)
            by_approver = {d.approver: d for d in in_force() if d.approver in names}
            out[obj.pk] = Ways(
                for_approvers=names,
                delegations=tuple(by_approver[n] for n in names if n in by_approver),
            )
        else:
            out[obj.pk] = Ways()
    return out


def _voted(obj: ApprovalRequest) -> Any:
    return lambda: {d.approver for d in obj.decisions.all()}


def refusal_by_row(request: HttpRequest, rows: Sequence[ApprovalRequest]) -> dict[int, str]:
    """Why this person may not decide each of ``rows`` (``ways_by_row``), by primary key; a
    row that is absent may be decided."""
    return {pk: w.refused for pk, w in ways_by_row(request, rows).items() if w.refused}


def refusals(request: HttpRequest, rows: list[ApprovalRequest]) -> list[str]:
    """Why this person may not decide some of ``rows`` at once (``ways_by_row``), or []:
    checked for all before any is decided. A call they could decide for several approvers
    is refused here: its page asks for whom."""
    ways = ways_by_row(request, rows)
    out = []
    for obj in rows:
        w = ways.get(obj.pk) or Ways()
        why = w.refused
        if not why and len(w.for_approvers) > 1:
            why = (
                f"you are the deputy of {', '.join(w.for_approvers)}, who may decide it: "
                "decide it on its page, saying for whom [approval.for_approver_needed]"
            )
        if why:
            out.append(f"call {obj.call_id} of run {obj.run_id}: {why}")
    return out


def _row(admin: AnyModelAdmin, obj: Any, mine: dict[int, bool]) -> dict[str, Any]:
    tool = tool_of(obj)
    summary = summary_of(tool, obj.arguments)
    if summary is None:
        summary = "; ".join(f"{t}: {v}" for t, v in fields_of(tool, obj.arguments))
    return {
        "obj": obj,
        "summary": summary,
        "run_url": run_url(admin, obj.run_id),
        "url": reverse("admin:durable_agents_approvalrequest_change", args=[obj.pk]),
        "progress": progress(obj.policy, obj.n_approved, obj.n_denied),
        "shown": shown_arguments(obj),
        "mine": mine.get(obj.pk),
    }


def bulk_decide(
    admin: AnyModelAdmin, request: HttpRequest, queryset: QuerySet[ApprovalRequest], approved: bool
) -> HttpResponse | None:
    """The "Approve selected" / "Deny selected" action: a confirmation page listing what
    will run (and, for a denial, asking for the message the model reads); once confirmed,
    each pending call decided through ``approve`` and a page saying, row by row, what
    happened. Rows no longer pending are listed and left alone."""
    selected = list(
        queryset.select_related("run").prefetch_related("decisions").order_by("created_at", "pk")
    )
    pending = [o for o in selected if o.status == APPROVAL_PENDING]
    skipped = [o for o in selected if o.status != APPROVAL_PENDING]
    username = admin_actor(request).username
    # A vote this person made, for themselves or as someone's deputy.
    mine = dict(
        Decision.objects.filter(
            Q(approver=username) | Q(deputy=username), request__in=pending
        ).values_list("request_id", "approved")
    )
    verb = "approve" if approved else "deny"
    refused = refusals(request, pending)
    note = str(request.POST.get("note") or "").strip()
    errors = []
    confirmed = request.POST.get("post") == "yes"
    if confirmed and not approved and not note:
        errors.append("Write the message the model reads as each denied call's result.")
    if confirmed and len(note) > NOTE_MAX:
        errors.append(f"The message is longer than {NOTE_MAX} characters.")
    if confirmed and refused:
        errors.append("Nothing was decided: you may not decide every selected call.")
    context: dict[str, Any] = {
        "verb": verb,
        "approved": approved,
        "action": f"{verb}_selected",
        "rows": [_row(admin, o, mine) for o in pending],
        "skipped": skipped,
        "refused": refused,
        "note": note,
        "errors": errors,
        "results": None,
        "form_url": request.get_full_path(),
    }
    title = f"{verb.capitalize()} {len(pending)} tool call{'s' if len(pending) != 1 else ''}"
    if not confirmed or errors or not pending:
        return page(
            admin, request, "admin/durable_agents/approvalrequest/bulk.html", title, context
        )
    results = []
    for row in context["rows"]:
        obj = row["obj"]
        # Decided for the arguments the confirmation page showed: if the call asks about
        # others by now, the engine refuses this row (approval.arguments_changed).
        try:
            shown = json.loads(request.POST.get(f"shown_{obj.pk}") or "")
        except ValueError:
            result = Decided("refused", "The arguments shown were not posted back; nothing done.")
        else:
            result = decide_call(request, obj, approved, note, arguments=shown)
        results.append({**row, "result": result})
    context["results"] = results
    done = f"{verb.capitalize()}d" if approved else "Denied"
    return page(admin, request, "admin/durable_agents/approvalrequest/bulk.html", done, context)
