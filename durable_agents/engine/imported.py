"""Imported runs (docs/replay.md, "Imports"): the one rule every command applies.

An export is a file anyone can edit: its journal may hold decisions nobody here made. So a
run imported without ``--live`` is *inert*: evidence to read, replay and compare, never
driven (the store grants no lease on it, and the drive refuses it by name), and nothing
in it is decided, answered, signalled, resolved, woken, cancelled or forked. Each command
that acts on a run asks ``refuse_inert`` first, on the run row it reads anyway; the
sweeps never see such a run (the store leaves it out of its listings of work).

Nor is an import anyone's sub-run (``foreign_sub_run``): a file may hold a run under the id
a parent here will give its next sub-run (``<parent>/<call>``), saying the sub-run finished
with whatever answer. A parent takes a sub-run's answer only from a run it started here:
never from an inert import, and, unless the parent was itself imported live, never from a
live one either (its answer is the file's, and the sub-run's own calls and decisions never
ran here).
"""

from __future__ import annotations

from typing import Any

from . import names, registry, runtime
from .approvals import (
    check_may_decide,
    eligible_for,
    policy_for,
    resolve_approver,
    verify_signature,
)
from .delegation import in_force_to
from .errors import ApprovalError, ConfigError, ImportRefused, RunImported
from .export import RunExport
from .ports import IMPORTED_LIVE, NOT_IMPORTED, ApprovalRequestInfo, RunInfo, Store
from .records import Record, encode

_CARRY_ON = (
    "To carry it on here, import it again with --live, which verifies every decision in it "
    "against this site's approver keys"
)


def refuse_inert(
    run: RunInfo | None, doing: str, *, where: str = "in it here", fix: str = _CARRY_ON
) -> None:
    """Refuse (``run.imported``) to ``doing`` on an inert import; nothing else is checked.
    ``where`` and ``fix`` (how to go on instead) complete the message."""
    if run is not None and run.inert:
        raise RunImported(
            f"run {run.run_id!r} was imported as evidence (inert): nobody may {doing} "
            f"{where}. {fix}",
            run_id=run.run_id,
        )


# What a caller does about an inert import at the id of its new request (a client's run id,
# a webhook delivery's turn).
NEW_REQUEST_FIX = (
    "Its answer is the file's, not something done here: start the request under another run "
    "id, or read the import as evidence (history, replay, the admin)"
)

# What a parent's call does about an import at its sub-run's id, for the messages.
SUB_RUN_FIX = (
    "It holds the id the call's sub-run would have: the call's result is this error, and a "
    "new call starts a sub-run of its own. The import stays as it came"
)


def foreign_sub_run(child: RunInfo | None, parent_imported: str = NOT_IMPORTED) -> bool:
    """Whether ``child``, the run found at a sub-run's id, is not its parent's to take (the
    parent's ``RunInfo.imported``: ``parent_imported``): an inert import, or a live import
    under a parent that was not imported live (a run made here started no such run)."""
    if child is None or child.imported == NOT_IMPORTED:
        return False
    return child.inert or parent_imported != IMPORTED_LIVE


def refuse_sub_run(child: RunInfo | None, parent: RunInfo | None, call_id: str) -> None:
    """Refuse (``run.imported``) to take ``child`` for the sub-run of ``parent``'s call
    ``call_id`` when it is foreign to it (``foreign_sub_run``), whatever it answered."""
    parent_imported = parent.imported if parent is not None else NOT_IMPORTED
    if child is None or not foreign_sub_run(child, parent_imported):
        return
    parent_id = parent.run_id if parent is not None else child.run_id.rpartition("/")[0]
    doing = f"take its answer for the sub-run of call {call_id!r} of run {parent_id!r}"
    refuse_inert(child, doing, where="here", fix=SUB_RUN_FIX)
    raise RunImported(
        f"run {child.run_id!r} was imported live from another site: nobody may {doing}, a "
        f"run made here (its answer is the file's; none of its calls ran here). {SUB_RUN_FIX}",
        run_id=child.run_id,
    )


def check_live(run: RunExport, store: Store | None = None) -> None:
    """Refuse (``ImportRefused``, naming the decision) to import ``run`` live unless every
    decision in it is verified here, as a signed decision relayed to this site would be
    (``approvals.verify_signature``): each ``decision`` row carries a signature by a key
    this site registered (and has not revoked) for that approver, over exactly the decided
    arguments, this start of the run, verdict, note and edit; the approver is an active
    user here who may decide the call under the tool's policy *here*. And each decision
    the journal records is backed by enough such rows: its decider's for one approver, the
    quorum's ``need`` for a quorum. The run's agent must be loaded here: it is driven here.

    A decision a deputy made for an approver (``engine.delegation``) verifies as one
    relayed here now would: signed by the deputy's key here, over bytes binding the approver
    it is for, by a deputy whom a delegation here (``store``'s, in force now) lets decide
    this call for an approver who may decide it here. A quorum counts a person once.

    Only decisions are verified: the file's model turns, tool results, answers and signals
    are taken as they are (docs/replay.md, "Imports")."""
    agent_name = str(run.row.get("agent") or "")
    try:
        agent = registry.get_agent(agent_name)
    except ConfigError:
        raise ImportRefused(
            f"run {run.run_id!r} belongs to agent {agent_name!r}, which this site does not "
            "load: a live import is driven here. Import it without --live to keep it as "
            "evidence",
            code="import.agent_missing",
        ) from None
    start = next((r for r in run.records if r.name == names.RUN_START), None)
    incarnation = str(start.get("incarnation") or "") if start is not None else ""
    requests = {str(r.get("call_id")): r for r in run.rows.get("approval_request", ())}
    signed_as = _origin_ids(run)
    verified: dict[str, list[tuple[str, bool, Any, str]]] = {}
    for row in run.rows.get("decision", ()):
        call_id = str(row.get("call_id"))
        request = _request(run, requests, call_id, agent)
        verified.setdefault(call_id, []).append(
            _verified(request, row, incarnation, signed_as, store)
        )
    for rec in run.records:
        if rec.name.startswith(names.APPROVAL):
            asked = next((c for c in requests if _decides(rec.name, c)), None)
            if asked is None:
                raise _unverified(run.run_id, rec.name, "no approval request in the file asks it")
            _backed(_request(run, requests, asked, agent), rec, verified.get(asked, []))


def _decides(name: str, call_id: str) -> bool:
    """Whether journal name ``name`` is a decision on ``call_id`` (asked again or not)."""
    first = names.decision(call_id)
    return name == first or (name.startswith(first + ":") and ":" not in name[len(first) + 1 :])


def _origin_ids(run: RunExport) -> dict[str, set[str]]:
    """The ids each approver had on the site that exported the run (its action rows and
    decision records name them): what their signatures bind, with the keys found here."""
    found: dict[str, set[str]] = {}
    for row in run.rows.get("action", ()):
        if row.get("actor") and row.get("actor_id"):
            found.setdefault(str(row["actor"]), set()).add(str(row["actor_id"]))
    for rec in run.records:
        if rec.name.startswith(names.APPROVAL) and rec.get("by") and rec.get("by_id"):
            found.setdefault(str(rec.get("by")), set()).add(str(rec.get("by_id")))
        if rec.name.startswith(names.APPROVAL) and rec.get("deputy") and rec.get("deputy_id"):
            found.setdefault(str(rec.get("deputy")), set()).add(str(rec.get("deputy_id")))
    return found


def _request(
    run: RunExport, requests: dict[str, dict[str, Any]], call_id: str, agent: Any
) -> ApprovalRequestInfo:
    row = requests.get(call_id)
    if row is None:
        raise _unverified(run.run_id, f"decision on call {call_id!r}", "it has no request")
    tool_name = str(row.get("tool_name") or "")
    tool = agent.tools.get(tool_name)
    if tool is None:
        raise _unverified(
            run.run_id,
            f"call {call_id!r}",
            f"its tool {tool_name!r} is not a tool of agent {agent.name!r} here",
        )
    # The policy the call is decided under *here*: the file's row could say anything.
    return ApprovalRequestInfo(
        run_id=run.run_id,
        call_id=call_id,
        tool_name=tool_name,
        arguments=row.get("arguments"),
        policy=policy_for(tool.safety.approval),
        start_seq=0,
    )


def _verified(
    request: ApprovalRequestInfo,
    row: dict[str, Any],
    incarnation: str,
    origin_ids: dict[str, set[str]],
    store: Store | None,
) -> tuple[str, bool, Any, str]:
    """The decision ``row`` as (approver, approved, edited arguments, who made it),
    verified; refused otherwise."""
    approver, approved, note = row.get("approver"), row.get("approved"), row.get("note") or ""
    deputy = row.get("deputy") or ""
    what = f"the decision of {approver!r} on call {request.call_id!r}"
    if deputy:
        what = f"the decision of {deputy!r} for {approver!r} on call {request.call_id!r}"
    if (
        not isinstance(approver, str)
        or not isinstance(approved, bool)
        or not isinstance(note, str)
        or not isinstance(deputy, str)
    ):
        raise _unverified(request.run_id, what, "it is malformed")
    signature = row.get("signature")
    if not isinstance(signature, str) or not signature:
        raise _unverified(request.run_id, what, "it carries no signature")
    try:
        principal = resolve_approver(approver)
        signer = resolve_approver(deputy) if deputy else principal
        policy = dict(request.policy)
        check_may_decide(
            signer,
            policy,
            eligible_for(policy, principal),
            for_approver=principal if deputy else None,
            delegations=in_force_to(store or runtime.store(), signer.username) if deputy else (),
            tool=request.tool_name,
        )
    except ApprovalError as exc:
        raise _unverified(request.run_id, what, str(exc)) from None
    edited = row.get("arguments")
    first: ApprovalError | None = None
    # The ids the signed bytes may name: here, or on the site that exported it.
    as_signer = (None, *sorted(origin_ids.get(signer.username, set()) - {signer.id}))
    as_principal = (None, *sorted(origin_ids.get(approver, set()) - {principal.id}))
    for signed_as in as_signer:
        for for_signed_as in as_principal if deputy else (None,):
            try:
                verify_signature(
                    request,
                    signer,
                    approved,
                    note,
                    signature,
                    incarnation=incarnation,
                    edited=edited,
                    signed_as=signed_as,
                    for_approver=principal if deputy else None,
                    for_signed_as=for_signed_as,
                )
                return approver, approved, edited, signer.username
            except ApprovalError as exc:
                first = first or exc
    raise _unverified(request.run_id, what, str(first))


def _backed(
    request: ApprovalRequestInfo, rec: Record, verified: list[tuple[str, bool, Any, str]]
) -> None:
    """Refuse a journaled decision that the verified rows do not make."""
    what = f"the recorded decision {rec.name!r}"
    approved = rec.get("approved") is True
    if encode(rec.get("arguments")) != encode(request.arguments):
        raise _unverified(
            request.run_id, what, "it is about other arguments than its request asks about"
        )
    edited = (rec.get("edited") or {}).get("arguments") if approved else None
    agreeing = [
        (who, hands)
        for who, said, args, hands in verified
        if said == approved and (not approved or encode(args) == encode(edited))
    ]
    # A person counts once: for themselves, or for one approver as a deputy.
    makers = list({hands: who for who, hands in reversed(agreeing)}.values())
    policy = dict(request.policy)
    need = int(policy.get("need", 1)) if policy.get("kind") == "quorum" else 1
    if approved and len(makers) < need:
        raise _unverified(
            request.run_id,
            what,
            f"it needs {need} verified approval(s) of these arguments; the file has {len(makers)}",
        )
    if not makers or (policy.get("kind") != "quorum" and rec.get("by") not in makers):
        raise _unverified(
            request.run_id, what, f"no verified decision by {rec.get('by')!r} makes it"
        )


def _unverified(run_id: str, what: str, why: str) -> ImportRefused:
    return ImportRefused(
        f"run {run_id!r} cannot be imported live: {what} does not verify here ({why}). "
        "Nothing was imported; import it without --live to keep it as evidence",
        code="import.unverified_decision",
    )
