"""The promise, checked after every schedule against the store and the outside ledger.

Vocabulary:

* A call's **owner** is the run whose model turn asked for it. A fork inherits the calls of
  the turns it copied (same call id, same turn record); its own later turns are its own.
* A call's **lineage**, seen from a run, is that run and — while the call was inherited
  with its attempt in flight (a live attempt marker and no result when the fork read its
  source) — the runs it came from. An effect anywhere in the lineage is an effect of the
  call as that run must account for it. A fork made before a call started begins a new
  timeline for it: the source's later execution is not the fork's.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from datetime import datetime
from itertools import pairwise
from typing import Any

from durable_agents.engine.approvals import arguments_tag, decision_name, tally
from durable_agents.engine.audit import verify_actions, verify_run
from durable_agents.engine.errors import JournalVersionError
from durable_agents.engine.journal import Journal
from durable_agents.engine.limits import parse_rate
from durable_agents.engine.names import is_compensation
from durable_agents.engine.names import result as result_name
from durable_agents.engine.ports import (
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    CANCELLED,
    FAILED,
    FINISHED,
    HALT_OPEN,
    HALT_OUTCOME_UNKNOWN,
    HALT_RESOLVED,
    HALTED,
    SLEEPING,
    TERMINAL_STATUSES,
    THROTTLED,
)
from durable_agents.engine.records import Record, encode
from durable_agents.engine.transcript import RunState
from durable_agents.engine.waits import all_answered, open_waits

from . import remote
from . import world as W
from .agent import (
    ERRAND,
    GATED,
    KEYED,
    NOT_HAPPENED,
    TIMED_OUT,
    UNDOS,
    UNFLAGGED,
    UNKNOWN_MESSAGE,
    is_agent_run,
    refund_v2,
)


def _short(value: Any, n: int = 60) -> str:
    text = value if isinstance(value, str) else encode(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _names(w: W.World, run_id: str) -> dict[str, Record]:
    return {r.name: r for r in Journal(w.raw).records(run_id)}


def _turn_of(names: dict[str, Record], call_id: str) -> int | None:
    n = 1
    while (turn := names.get(f"model:{n}")) is not None:
        for call in (turn.get("message") or {}).get("tool_calls") or ():
            if call.get("id") == call_id:
                return n
        n += 1
    return None


def _inherited_from(w: W.World, run_id: str, call_id: str) -> str | None:
    """The source a fork copied ``call_id``'s turn from, or None if the call is its own."""
    row = w.raw.get_run(run_id)
    if row is None or not row.forked_from:
        return None
    names = _names(w, run_id)
    n = _turn_of(names, call_id)
    if n is None or "fork" not in names:
        return None
    done = names.get("fork:done")
    if row.forked_from in w.forgotten:
        # Copied from a run the operator deleted meanwhile: its journal went with it, so only
        # the fork's own turns (after its copy was done) can be told apart.
        return row.forked_from if done is None or names[f"model:{n}"].seq < done.seq else None
    if done is not None and names[f"model:{n}"].seq > done.seq:
        # The fork generated this turn itself (after its copy was done): a fork taken before
        # the turn may well be answered the same by a deterministic model, call ids and all.
        return None
    source = _names(w, row.forked_from).get(f"model:{n}")
    if source is None or source.data != names[f"model:{n}"].data:
        return None
    return row.forked_from


def _snapshot(w: W.World, fork_id: str, source: str) -> list[Any]:
    """What the fork read of its source: captured as its row was created (the fork's read
    of its source comes before); failing that, the source's entries older than the fork's
    first record."""
    if fork_id in w.fork_snapshots:
        return list(w.fork_snapshots[fork_id])
    first = w.raw.get(fork_id, "fork")
    limit = first.seq if first is not None else 0
    return [e for e in w.raw.load(source) if e.seq < limit]


def _in_flight(snapshot: list[Any], call_id: str) -> bool:
    names = {e.name for e in snapshot}
    if f"tool:{call_id}" in names:
        return False
    k = 1
    live = False
    while f"attempt:{call_id}:{k}" in names:
        live = f"not-started:{call_id}:{k}" not in names
        k += 1
    return live


def owner(w: W.World, run_id: str, call_id: str) -> str:
    while (source := _inherited_from(w, run_id, call_id)) is not None:
        run_id = source
    return run_id


def lineage(w: W.World, run_id: str, call_id: str) -> list[str]:
    runs = [run_id]
    while (source := _inherited_from(w, run_id, call_id)) is not None:
        if not _in_flight(_snapshot(w, run_id, source), call_id):
            break
        run_id = source
        runs.append(run_id)
    return runs


def effects_seen_by(w: W.World, run_id: str, call_id: str) -> list[W.Effect]:
    """What the ledger says call ``call_id`` did, as run ``run_id`` must account for it."""
    runs = lineage(w, run_id, call_id)
    return [e for e in w.ledger if e.call == call_id and e.run in runs and e.effect]


def check_as_we_go(w: W.World) -> None:
    """After every step: a resolved halt stays resolved."""
    for (run_id, call_id), res in w.resolutions.items():
        # One row per attempt that halted; once the call is resolved, every one of them is
        # resolved with that outcome (no attempt comes after a resolution).
        rows = [h for h in w.raw.list_halts(run_id=run_id, status=None) if h.op_id == call_id]
        for halt in rows:
            if halt.status == HALT_RESOLVED and encode(
                (halt.resolution or {}).get("result")
            ) == encode(res["result"]):
                continue
            w.violate(
                "halts_stay_resolved",
                f"halt {run_id}/{call_id}, first resolved by {res['by']} at "
                f"t={res['t'] - W.EPOCH:.1f}, is {halt.status} again "
                f"(resolution now {_short(halt.resolution)})",
                hole="5",
            )


def _records(w: W.World, run_id: str) -> list[Record]:
    """A run's journal; one whose first record is not the header (a write that landed on the
    id of a run deleted meanwhile, with nothing to hold it back) is a finding, not a crash of
    the checks."""
    try:
        return Journal(w.raw).records(run_id)
    except JournalVersionError as exc:
        w.violate("rows_agree", f"run {run_id}: {exc}", hole="new")
        return []


class Index:
    """The store read once, for the end-of-schedule checks."""

    def __init__(self, w: W.World) -> None:
        self.records = {r: _records(w, r) for r in w.runs}
        self.names = {r: {rec.name: rec for rec in recs} for r, recs in self.records.items()}
        self.rows = {r: w.raw.get_run(r) for r in w.runs}
        self.world = w
        self.halts = list(w.raw.list_halts(status=None))
        self.requests = list(w.raw.list_approval_requests(status=None))
        self.by_call: dict[tuple[str, str], list[W.Effect]] = defaultdict(list)
        for e in w.ledger:
            self.by_call[(e.run, e.call)].append(e)


def _awaits_its_parent(w: W.World, ix: Index, run_id: str) -> bool:
    """A fork's own sub-run (a fork of the child its source's parent waited on) waits for its
    forked parent to drive it: legitimately, while the parent's call that names it has no
    result and the parent has not ended, or for good if the parent is a half-made fork."""
    row = ix.rows[run_id]
    if row is None or not row.forked_from or not row.parent_run_id:
        return False
    parent = row.parent_run_id
    records = ix.records.get(parent)
    if records is None:
        records = Journal(w.raw).records(parent)
    by_name = {rec.name: rec for rec in records}
    calls = [
        rec.name.removeprefix("child:")
        for rec in records
        if rec.name.startswith("child:") and rec.get("run_id") == run_id
    ]
    parent_row = w.raw.get_run(parent)
    if parent_row is not None and parent_row.forked_from and "fork:done" not in by_name:
        # A half-made fork (its maker died or lost its lease while copying) never drives its
        # sub-runs: they wait for good, a documented limit (``tree_agrees`` checks that
        # nobody drove them on their own).
        return True
    return (
        bool(calls)
        and all(f"tool:{c}" not in by_name for c in calls)
        and (parent_row is not None and parent_row.status not in TERMINAL_STATUSES)
    )


def check_all(w: W.World) -> None:
    ix = Index(w)
    check_effects(w, ix)
    check_results(w, ix)
    check_approvals(w, ix)
    check_quorums(w, ix)
    check_halts(w, ix)
    check_halt_reasons(ix)
    check_rows(w, ix)
    check_recovery(w, ix)
    check_spend(w, ix)
    check_forks(w, ix)
    check_agent_runs(w, ix)
    check_steps(w, ix)
    check_waits(w, ix)
    check_channels(w, ix)
    check_trees(w, ix)
    check_sagas(w, ix)
    check_stops(w, ix)
    check_chains(w)
    check_imports(w, ix)
    check_spent(w)
    check_pruning(w)
    check_adoptions(w, ix)
    check_takeovers(w, ix)
    check_limits(w, ix)
    check_rules(w, ix)
    check_expiries(w, ix)
    check_votes(w, ix)
    check_notifications(w)
    remote.check(w, ix)
    check_as_we_go(w)


def _engine_error(ix: Index, run_id: str, call_id: str) -> str | None:
    rec = ix.names.get(run_id, {}).get(f"tool:{call_id}")
    if rec is None or not rec.get("is_error") or rec.get("reconciled") or rec.get("patched"):
        return None
    if any(_raised(e) for e in ix.by_call.get((run_id, call_id), ())):
        return None  # the tool itself raised
    result = rec.get("result")
    return str(result.get("error") if isinstance(result, dict) else result)


def _raised(e: W.Effect) -> bool:
    """The tool raised, so an error result is its own. (An unknown outcome of an
    at-most-once call is no result at all: the run must halt on it.)"""
    return e.outcome == "raised" or (e.outcome == "unknown" and e.tool not in UNFLAGGED)


def _run_failed_at_the_server(ix: Index, run_id: str, call_id: str) -> bool:
    """A keyed MCP call (retry-safe) whose journaled outcome is the error of a run whose
    request failed at the connection (the server down: ``McpUnavailable``; the request
    lost before it left, taken conservatively for an unknown outcome): true of that run,
    though an earlier run of the call, whose driver died before journaling it, took
    effect. The engine cannot know; the key dedupes the call's runs, not the model's next
    call."""
    rec = ix.names.get(run_id, {}).get(f"tool:{call_id}")
    if rec is None or rec.get("name") != remote.MAIL or not rec.get("is_error"):
        return False
    result = rec.get("result")
    error = str(result.get("error") if isinstance(result, dict) else result)
    return error.startswith(
        (
            f"McpUnavailable: MCP server {remote.SERVER!r} does not answer",
            f"McpOutcomeUnknown: the connection to MCP server {remote.SERVER!r} failed after",
        )
    )


def check_effects(w: W.World, ix: Index) -> None:
    """Each at-most-once operation takes effect at most once per run (a model asks again
    only after an error result, so a second effect means the error was false), and a fork
    never repeats a call that was in flight when it was made. Keyed and idempotent calls
    take effect at most once per call across a run and its forks (their keys match)."""
    effects = [e for e in w.ledger if e.effect and e.tool in UNFLAGGED | KEYED]
    per_op: dict[tuple[str, str, Any], list[W.Effect]] = defaultdict(list)
    for e in effects:
        per_op[(e.run, e.tool, e.args.get("order"))].append(e)
    for (run_id, tool, order), found in per_op.items():
        if len(found) < 2:
            continue
        if tool in KEYED and all(
            any(o.outcome == "unknown" for o in w.ledger if (o.run, o.call) == (run_id, e.call))
            or _run_failed_at_the_server(ix, run_id, e.call)
            for e in found[:-1]
        ):
            # An idempotent call whose answer was lost (any of its runs) reads as an error
            # (outcome unknown, truly): the model asking again makes a new call, under a new
            # key (remote.py). So does one whose driver died after the server answered, when
            # its re-run failed at the connection.
            continue
        calls = [e.call for e in found]
        if any(e.pid in w.beyond for e in found) and any(
            (r := w.resolutions.get((run_id, c))) is not None and r["result"] == NOT_HAPPENED
            for c in calls
        ):
            # A process frozen longer than HALT_MIN_AGE inside the call landed its effect
            # after a person recorded "did not happen", and the model asked again: the one
            # outcome the minimum age can only make unlikely (docs/simulation.md, Limits).
            continue
        hole = "?"
        for c in calls:
            err = _engine_error(ix, run_id, c) or ""
            if "invalid arguments" in err or "unknown tool" in err:
                hole = "1"
            res = w.resolutions.get((run_id, c))
            if res is not None and res["result"] == NOT_HAPPENED:
                hole = "3"
        w.violate(
            "effects_once",
            f"run {run_id}: {tool} of order {order} took effect {len(found)} times "
            f"(calls {', '.join(calls)} at t={', '.join(f'{e.t:.1f}' for e in found)})",
            hole=hole,
        )
    for e in effects:
        if e.tool in UNFLAGGED:
            runs = lineage(w, e.run, e.call)
            if len(runs) > 1:
                w.violate(
                    "effects_once",
                    f"fork {e.run} ran call {e.call} ({e.tool}) again: it was in flight in "
                    f"{runs[-1]} (an attempt and no result) when the fork was made",
                    hole="2",
                )
    per_call: dict[tuple[str, str], list[W.Effect]] = defaultdict(list)
    for e in effects:
        if e.tool in KEYED:
            per_call[(owner(w, e.run, e.call), e.call)].append(e)
    for (origin, call_id), found in per_call.items():
        if len(found) > 1:
            runs = sorted({e.run for e in found})
            w.violate(
                "effects_once",
                f"{found[0].tool} call {call_id} of {origin} took effect {len(found)} times "
                f"downstream, in runs {runs}, under keys {sorted({e.key[:8] for e in found})}",
                hole="2" if len(runs) > 1 else "?",
            )


def _copied(w: W.World, ix: Index, run_id: str, call_id: str, rec: Record) -> bool:
    source = _inherited_from(w, run_id, call_id)
    if source is None:
        return False
    if source in w.forgotten:
        # A fork copied it from a run the operator deleted meanwhile: the evidence it would
        # be checked against went with the run (``World.forget``).
        return True
    theirs = ix.names.get(source, {}).get(f"tool:{call_id}")
    return theirs is not None and theirs.data == rec.data


def check_results(w: W.World, ix: Index) -> None:
    """Each recorded result is what the tool returned, or what a person recorded; an error
    the engine writes (bad arguments, unknown tool) is never recorded for a call whose
    effect happened."""
    for run_id in w.runs:
        for name, rec in ix.names[run_id].items():
            if not name.startswith("tool:"):
                continue
            call_id = name[5:]
            if rec.get("patched") or _copied(w, ix, run_id, call_id, rec):
                continue
            result, is_error = rec.get("result"), bool(rec.get("is_error"))
            if rec.get("reconciled"):
                res = w.resolutions.get((run_id, call_id))
                asked = [
                    a
                    for a in w.resolution_attempts
                    if (a["run"], a["call"]) == (run_id, call_id)
                    and encode(a["result"]) == encode(result)
                    and a["is_error"] == is_error
                ]
                if not asked:
                    w.violate(
                        "results_true",
                        f"run {run_id}: call {call_id} holds a resolution {_short(result)} "
                        "that no person recorded for it",
                    )
                elif (
                    res is not None
                    and res["result"] == NOT_HAPPENED
                    and (seen := effects_seen_by(w, run_id, call_id))
                ):
                    if all(e.pid in w.beyond for e in seen):
                        w.count("beyond the promise: an effect landed after 'did not happen'")
                        continue
                    w.violate(
                        "results_true",
                        f"run {run_id}: the halt of {call_id} was resolved 'did not happen' by "
                        f"{res['by']}, who found the ledger empty at "
                        f"t={res['t'] - W.EPOCH:.1f}; the effect landed at t={seen[0].t:.1f} "
                        f"(ledger #{seen[0].seq}, by {seen[0].run}): its driver was only stalled",
                        hole="3",
                    )
                continue
            runs = ix.by_call.get((run_id, call_id), [])
            if rec.get("name") == ERRAND:
                continue  # a sub-run's answer, not a ledgered tool: ``check_trees``
            if not is_error:
                if encode(result) not in {encode(e.value) for e in runs if e.outcome == "returned"}:
                    w.violate(
                        "results_true",
                        f"run {run_id}: call {call_id} records {_short(result)}, which no run "
                        "of the tool returned",
                    )
                continue
            err = _engine_error(ix, run_id, call_id)
            if err is None or err == "denied":
                continue
            if _run_failed_at_the_server(ix, run_id, call_id):
                w.count("keyed MCP calls whose re-run failed at the connection")
                continue
            seen = effects_seen_by(w, run_id, call_id)
            if seen:
                hole = "1" if ("invalid arguments" in err or "unknown tool" in err) else "?"
                w.violate(
                    "results_true",
                    f"run {run_id}: call {call_id} ({rec.get('name')}) took effect (ledger "
                    f"#{seen[0].seq} by {seen[0].run} returned {_short(seen[0].value, 40)}) "
                    f"but the journal records the error {_short(err, 70)!r}",
                    hole=hole,
                )


def check_approvals(w: W.World, ix: Index) -> None:
    """A gated call runs only after an approval in the run that runs it, with exactly the
    arguments the person approved; a denied call never runs."""
    for e in w.ledger:
        if e.tool not in GATED or not e.effect:
            continue
        decision = ix.names.get(e.run, {}).get(f"approval:{e.call}")
        if decision is None or not decision.get("approved"):
            w.violate("approvals_kept", f"run {e.run}: gated call {e.call} ran unapproved")
            continue
        if any(
            rec.get("automatic") and rec.get("approved") and _runs_as(rec.get("arguments"), e.args)
            for rec in _named(ix.names.get(e.run, {}), "approval", e.call).values()
        ):
            # Asked again about these arguments (a deploy), and the approval rules of the
            # day allowed them (issue 42): nobody's approval of the earlier ones is what ran.
            continue
        seen = [*w.approved.get((e.run, e.call), ()), *_stood_unseen(w, ix, e.run, e.call)]
        if seen and all(encode(args) != encode(e.args) for args in seen):
            w.violate(
                "approvals_kept",
                f"run {e.run}: call {e.call} was approved as {encode(seen[-1])} and ran as "
                f"{encode(e.args)}",
                hole="11",
            )
    for run_id, call_id in sorted(w.denied):
        # The last word on a call is what holds: a denial of it asked again about other
        # arguments (a deploy) is followed by an approval of the arguments asked about next.
        decisions = [
            r
            for n, r in ix.names.get(run_id, {}).items()
            if n == f"approval:{call_id}" or n.startswith(f"approval:{call_id}:")
        ]
        last_denial = max((r.seq for r in decisions if not r.get("approved")), default=0)
        overruled = any(r.get("approved") and r.seq > last_denial for r in decisions)
        if not overruled and any(e.effect for e in ix.by_call.get((run_id, call_id), ())):
            w.violate("approvals_kept", f"run {run_id}: denied call {call_id} ran")
        # The denier's message is the result the model reads (a quorum whose approvers
        # disagreed fails with nobody's denial).
        if (run_id, call_id) not in w.denials:
            continue
        if decisions and all(
            not r.get("approved")
            and isinstance(r.get("tally"), dict)
            and not (r.get("tally") or {}).get("denied_by")
            for r in decisions
        ):
            # No denial was counted: the quorum failed on approvals of different arguments,
            # and the denier's vote did not count (they had voted already, as a deputy for
            # someone else; or an edit moved the call to a group they are not in: issue 42).
            continue
        result = ix.names.get(run_id, {}).get(f"tool:{call_id}")
        message = W.deny_message(call_id)
        denial = result.get("result") if result is not None else None
        if (
            isinstance(denial, dict)
            and denial.get("error") == "denied"
            and message not in str(denial.get("message"))
        ):
            w.violate(
                "approvals_kept",
                f"run {run_id}: denied call {call_id} reads {_short(denial, 70)!r}, not the "
                "denier's message",
            )


def check_quorums(w: W.World, ix: Index) -> None:
    """A call gated by a quorum of ``need`` runs only after ``need`` distinct members of its
    group asked to approve exactly what ran (an edit: what the tool made of it), counted
    outside the journal from what people submitted (an approval of the run it was forked
    from counts for a fork): one person deciding twice, or someone outside the group, never
    makes up the number. The journal's decision agrees: its tally names that many distinct
    approvers."""
    for e in w.ledger:
        if e.tool not in GATED or not e.effect:
            continue
        names = ix.names.get(e.run, {})
        decisions = [
            rec
            for name, rec in names.items()
            if (name == f"approval:{e.call}" or name.startswith(f"approval:{e.call}:"))
            and rec.get("approved")
        ]
        need = max((int((rec.get("tally") or {}).get("need") or 1) for rec in decisions), default=1)
        if need < 2:
            continue
        lineage, row = {e.run}, ix.rows.get(e.run)
        while row is not None and row.forked_from and row.forked_from not in lineage:
            lineage.add(row.forked_from)
            row = ix.rows.get(row.forked_from) or w.raw.get_run(row.forked_from)
        people = {
            by
            for run_id, call_id, by, args in w.submitted
            if run_id in lineage
            and call_id == e.call
            and by in w.eligible
            and (
                encode(args) == encode(e.args)
                or ((run_id, call_id, by) in w.edits and _runs_as(args, e.args))
            )
        }
        if len(people) < need:
            w.violate(
                "quorums_need_people",
                f"run {e.run}: quorum call {e.call} (needs {need}) ran as {encode(e.args)}, "
                f"approved so by {sorted(people) or 'nobody'} of {w.eligible}",
                hole="new",
            )
        for rec in decisions:
            approvers = list((rec.get("tally") or {}).get("approved_by") or ())
            if len(set(approvers)) < need or not set(approvers) <= set(w.eligible):
                w.violate(
                    "quorums_need_people",
                    f"run {e.run}: the decision on quorum call {e.call} counts {approvers} "
                    f"(needs {need} distinct members of {w.eligible})",
                    hole="new",
                )

    # Who a quorum's decision names as its decider is someone its outcome rests on: a
    # counted approver of a passed quorum, a denier of a failed one (its voters race to
    # write it; the write can fall to a vote that was not counted, or to an approval).
    for run_id, records in ix.names.items():
        for name, rec in records.items():
            tally = rec.get("tally") if rec.get("kind") == "approval" else None
            if not isinstance(tally, dict) or int(tally.get("need") or 1) < 2:
                continue
            rests_on = tally.get("approved_by") if rec.get("approved") else tally.get("denied_by")
            if rests_on and rec.get("by") not in rests_on:
                w.violate(
                    "quorums_need_people",
                    f"run {run_id}: {name} names {rec.get('by')!r} as its decider; it rests "
                    f"on {rests_on}",
                    hole="new",
                )


def _runs_as(approved: Any, ran: dict[str, Any]) -> bool:
    """An edit ``approved`` is one of the call that ran with ``ran``: the engine validates
    an edit under the code deployed, which fills in the fields a deploy gave defaults since
    the person's page was drawn. (An approval as asked must be of exactly what ran.)"""
    return isinstance(approved, dict) and all(
        k in ran and encode(ran[k]) == encode(v) for k, v in approved.items()
    )


def _stood_unseen(w: W.World, ix: Index, run_id: str, call_id: str) -> list[Any]:
    """Approvals whose makers never saw their outcome (they died after the journal took
    them, at ``after-decision``) but which stand: the journal's decision on the call names
    them as its maker and runs exactly what they submitted. Other approvers of the call are
    then refused (``approval.already_decided``), so nobody alive recorded what runs."""
    decisions = [
        rec
        for name, rec in ix.names.get(run_id, {}).items()
        if name == f"approval:{call_id}" or name.startswith(f"approval:{call_id}:")
    ]
    stood = []
    for sub_run, sub_call, by, args in w.submitted:
        if (sub_run, sub_call) != (run_id, call_id):
            continue
        for rec in decisions:
            runs = (rec.get("edited") or {}).get("arguments") or rec.get("arguments")
            if rec.get("approved") and rec.get("by") == by and encode(runs) == encode(args):
                stood.append(args)
    return stood


def check_halt_reasons(ix: Index) -> None:
    """A halt on an attempt whose tool said it could not tell (``@unknown/<attempt>`` in the
    journal) says so, in the tool's words; a halt says so only then. The row is a projection
    of the journal whichever drive wrote it: the one the tool raised in, or a later one (a
    crash between the two writes, a fork that copied the attempt)."""
    w = ix.world
    for halt in ix.halts:
        said = ix.names.get(halt.run_id, {}).get(f"@unknown/{halt.attempt}")
        if said is None:
            source = _inherited_from(w, halt.run_id, halt.op_id)
            if source is not None and any(
                e.name == f"@unknown/{halt.attempt}" for e in _snapshot(w, halt.run_id, source)
            ):
                # Issue 43: the fork copied the claim from a source whose tool had said it
                # could not tell; the fork must carry that word, not only the claim.
                w.violate(
                    "halts_say_why",
                    f"fork {halt.run_id} halts on {halt.op_id} ({halt.cause}) without the "
                    f"tool's word its source {source} journaled (@unknown/{halt.attempt})",
                )
            if halt.cause == HALT_OUTCOME_UNKNOWN:
                ix.world.violate(
                    "halts_say_why",
                    f"halt {halt.run_id}/{halt.op_id} gives a reason its journal does not hold",
                )
            continue
        reason = said.get("reason") or {}
        if halt.tool_name in (remote.PAY, remote.MAIL, remote.PEEK):
            # The MCP connection's word: the connection failed after (or, as far as it can
            # tell, before) the request was sent (``mcp/connection.py``).
            told = str(reason.get("message") or "").startswith(
                f"the connection to MCP server {remote.SERVER!r} failed after the call of "
            )
            if not told or reason.get("type") != "McpOutcomeUnknown":
                ix.world.violate(
                    "halts_say_why", f"run {halt.run_id} journaled {reason!r} for {halt.op_id}"
                )
        elif halt.tool_name == remote.SHIP:
            # The task's word (``mcp/tasks.py``): its call's answer lost, the server no
            # longer knowing the task, or the task not done in its time.
            message = str(reason.get("message") or "")
            told = message.startswith(remote.TASK_REASONS) or " did not finish in " in message
            if not told or reason.get("type") != "McpOutcomeUnknown":
                ix.world.violate(
                    "halts_say_why", f"run {halt.run_id} journaled {reason!r} for {halt.op_id}"
                )
        elif reason.get("message") != UNKNOWN_MESSAGE or reason.get("type") != "ToolOutcomeUnknown":
            ix.world.violate(
                "halts_say_why", f"run {halt.run_id} journaled {reason!r} for {halt.op_id}"
            )
        if halt.cause != HALT_OUTCOME_UNKNOWN or encode(halt.reason) != encode(reason):
            ix.world.violate(
                "halts_say_why",
                f"halt {halt.run_id}/{halt.op_id} says {halt.cause} {halt.reason!r}; its "
                f"journal says the tool said {reason!r}",
            )


def check_halts(w: W.World, ix: Index) -> None:
    """An open halt is one a person can still resolve: its call has no result and its run
    is not over. Requests likewise."""
    for halt in ix.halts:
        if halt.status != HALT_OPEN:
            continue
        names = ix.names.get(halt.run_id, {})
        row = ix.rows.get(halt.run_id)
        result = names.get(result_name(halt.op_id))  # an undo's is its own name
        if result is not None:
            if (halt.run_id, halt.op_id) in w.resolutions or (
                halt.created_at is not None
                and result.created_at is not None
                and halt.created_at > result.created_at
            ):
                why, hole = "a stale driver wrote the halt again after it was resolved", "5"
            elif result.get("reconciled"):
                why, hole = "the resolution stopped between the journal and the halt row", "new"
            else:
                err = _engine_error(ix, halt.run_id, halt.op_id) or ""
                why = f"a drive recorded {_short(result.get('result'), 60)} over the halt"
                hole = "1" if ("invalid arguments" in err or "unknown tool" in err) else "?"
            w.violate(
                "halts_stay_resolved",
                f"halt {halt.run_id}/{halt.op_id} is open though the call has a result: {why}",
                hole=hole,
            )
        elif row is not None and row.status in TERMINAL_STATUSES:
            w.violate(
                "rows_agree",
                f"run {halt.run_id} is {row.status} with an open halt on {halt.op_id}",
                hole="6",
            )
    for req in ix.requests:
        row = ix.rows.get(req.run_id)
        if req.status != "pending" or row is None:
            continue
        if row.status in TERMINAL_STATUSES:
            w.violate(
                "rows_agree",
                f"run {req.run_id} is {row.status} with a pending approval of {req.call_id}",
                hole="6",
            )
            continue
        # Whatever its row says (failed after a failed undo, halted mid-rollback): a run
        # whose journal ended its forward path never runs the call, so nobody may decide it.
        ended = [n for n in ("saga:abort", "run:cancelled") if n in ix.names.get(req.run_id, {})]
        if ended:
            w.violate(
                "rows_agree",
                f"run {req.run_id} ({row.status}, its journal holds {ended[0]}) has a pending "
                f"approval of {req.call_id}: staff can still decide a call it will never run",
                hole="6",
            )


def check_rows(w: W.World, ix: Index) -> None:
    """The run row agrees with the journal, and a run at rest waits on something real."""
    open_halts = {(h.run_id, h.op_id) for h in ix.halts if h.status == HALT_OPEN}
    # A pending request, and the journal name its decision will have: a call asked again
    # for other arguments (a deploy changed them) is decided under a name of its own.
    pending = {
        (r.run_id, r.call_id): decision_name(
            r.call_id, r.arguments, again=r.previous_arguments is not None
        )
        for r in ix.requests
        if r.status == "pending"
    }
    for run_id in w.runs:
        row, names = ix.rows[run_id], ix.names[run_id]
        if row is None or not is_agent_run(run_id):
            continue
        complete, cancelled = names.get("run:complete"), names.get("run:cancelled")
        if complete is not None and cancelled is not None:
            first = "run:complete" if complete.seq < cancelled.seq else "run:cancelled"
            w.violate(
                "rows_agree",
                f"run {run_id} is both complete and cancelled ({first} first: cancel "
                "checked the run's status before it took the lease)",
                hole="new",
            )
        elif (
            complete is not None
            and "saga:abort" not in names  # a finished sub-run its parent's saga rolled back
            and (row.status != FINISHED or row.answer != complete.get("answer"))
        ):
            w.violate(
                "rows_agree",
                f"run {run_id}: the journal holds run:complete, the row says {row.status} "
                f"(answer {_short(row.answer or '', 30)!r})",
                hole="7" if w.split_writes else "?",
            )
        if cancelled is not None and row.status != CANCELLED:
            w.violate(
                "rows_agree",
                f"run {run_id} was cancelled (run:cancelled) but its row says {row.status}",
                hole="6",
            )
        if row.status == FINISHED and complete is None:
            w.violate("rows_agree", f"run {run_id} is finished without run:complete")
        if row.status == CANCELLED and cancelled is None:
            w.violate("rows_agree", f"run {run_id} is cancelled without run:cancelled")
        # A saga rolling back its sub-runs pauses as the sub-run it waits on does; so does a
        # parent whose call's sub-run has not ended (the tree's pause).
        rolling_back = "saga:abort" in names and "run:compensated" not in names
        waits_on_child = any(
            (child := ix.rows.get(str(rec.get("run_id")))) is not None
            and (rolling_back or f"tool:{rec.get('call_id')}" not in names)
            and child.status
            in (HALTED, AWAITING_INPUT, AWAITING_APPROVAL, SLEEPING, "compensating", "queued")
            for n, rec in names.items()
            if n.startswith("child:")
        )
        # A rollback halts on an undo whose outcome is unknown (``compensate:<call>``, its
        # outcome under that name) as a forward drive halts on a call.
        undo_halts = [
            op for r, op in open_halts if r == run_id and is_compensation(op) and op not in names
        ]
        if (
            row.status == HALTED
            and not waits_on_child
            and not undo_halts
            and not any((run_id, c) in open_halts for c in _pending_calls(names))
        ):
            w.violate("rows_agree", f"run {run_id} is halted with nothing left to resolve")
        if (
            row.status == AWAITING_APPROVAL
            and not waits_on_child
            and not any(
                (run_id, c) in pending and pending[(run_id, c)] not in names
                for c in _pending_calls(names)
            )
        ):
            w.violate(
                "rows_agree",
                f"run {run_id} awaits approval with nothing left to decide",
                hole="new" if any(n.startswith("approval:") for n in names) else "?",
            )
        if row.status == AWAITING_APPROVAL:
            for request in ix.requests:
                if (request.run_id, request.status) != (run_id, "pending"):
                    continue
                if request.policy.get("kind") != "quorum":
                    continue
                votes = w.raw.list_decisions(run_id, request.call_id)
                count = tally(request.policy, votes, w.eligible)
                # (A quorum its group is too small for fails at its first vote, not before.)
                if votes and (count.passed or count.unreachable):
                    # Its last vote's maker died between the vote and the decision's record.
                    w.violate(
                        "rows_agree",
                        f"run {run_id} awaits a quorum on {request.call_id} that its votes "
                        f"decided ({'passed' if count.passed else 'failed'}) with no decision "
                        "recorded",
                        hole="new",
                    )
        if (
            row.status == SLEEPING
            and not waits_on_child
            and not any(wait.kind == "timer" for wait in open_waits(ix.records[run_id]))
        ):
            w.violate("rows_agree", f"run {run_id} sleeps with no timer left to wait for")
        if row.status == AWAITING_INPUT and not waits_on_child:
            waits = open_waits(ix.records[run_id])
            if not waits and not _awaits_its_parent(w, ix, run_id):
                w.violate("rows_agree", f"run {run_id} awaits input with nothing left to wait for")
            for wait in waits:
                if wait.signal_delivered:
                    w.violate(
                        "rows_agree",
                        f"run {run_id} awaits signal {wait.name}, which was delivered: a lost "
                        "wake-up",
                        hole="new",
                    )
        if row.status == FAILED and not row.last_error:
            w.violate("rows_agree", f"run {run_id} failed without an error", hole="6")
        if (
            row.status == FAILED
            and (row.last_error or {}).get("code") == "history.fork_incomplete"
            and "fork:done" in names
        ):
            w.violate(
                "rows_agree",
                f"fork {run_id} is copied (fork:done) but its row still says it is not",
                hole="new",
            )


def _pending_calls(names: dict[str, Record]) -> list[str]:
    n = 1
    last = None
    while (turn := names.get(f"model:{n}")) is not None:
        last = turn
        n += 1
    if last is None:
        return []
    calls = (last.get("message") or {}).get("tool_calls") or ()
    return [c["id"] for c in calls if f"tool:{c['id']}" not in names]


def _recovery_cause(w: W.World, ix: Index, run_id: str) -> tuple[str, str]:
    names = ix.names.get(run_id, {})
    row = ix.rows.get(run_id)
    drive = w.last_drive.get(run_id, "?")
    if run_id.endswith(">session"):
        return "a session's own journal, driven as an agent run", "4"
    if run_id.startswith("steps-"):
        return f"a run only Journal.step wrote to (no agent; the drive: {drive})", "new"
    if "run:cancelled" in names:
        return f"cancelled in the journal, {row.status if row else '?'} in its row", "6"
    if "fork" in names and "fork:done" not in names:
        return f"a fork that died half-copied; the drive: {drive}", "new"
    if "run:complete" in names:
        return "finished in the journal, not in its row", "7"
    if "agent_drift" in drive:
        return f"on_drift='error' refuses it before the drive's error handling ({drive})", "6"
    return f"the drive: {drive}", "?"


def check_recovery(w: W.World, ix: Index) -> None:
    """Recovery settles: a few passes after the last crash, it hands nothing over."""
    rounds = w.recovery_rounds
    if rounds and rounds[-1]:
        for run_id in sorted(set(rounds[-1])):
            row = ix.rows.get(run_id) or w.raw.get_run(run_id)
            cause, hole = _recovery_cause(w, ix, run_id)
            error = (row.last_error or {}).get("code") if row else None
            w.violate(
                "recovery_settles",
                f"recovery hands {run_id} ({row.status if row else '?'}, last_error {error}) "
                f"to a driver on every pass: {cause}",
                hole=hole,
            )
    for kind, run_id in w.dispatches:
        if kind == "recovery" and not is_agent_run(run_id):
            w.violate(
                "only_agent_runs_run",
                f"recovery dispatched {run_id}, which is not an agent run",
                hole="4" if run_id.endswith(">session") else "new",
            )


def check_takeovers(w: W.World, ix: Index) -> None:
    """A ``@takeover/`` record tells the truth: written after the lease it replaced had
    expired, in a journal whose header stays first. (Holders are named by process and
    thread, all alike here: the lease tokens tell drivers apart.)"""
    for run_id in w.runs:
        records = ix.records[run_id]
        for i, rec in enumerate(records):
            if not rec.name.startswith("@takeover/"):
                continue
            expired = datetime.fromisoformat(str(rec.get("expired_at")))
            if i == 0:
                w.violate(
                    "takeovers_true",
                    f"run {run_id}: takeover {rec.name} is the journal's first record",
                    hole="new",
                )
            elif (
                rec.created_at is not None
                and expired > rec.created_at
                # Taken at once from a process that died (instant takeover, PostgreSQL): the
                # lane checks, as it happens, that its holder's session was gone (pg_lane.py).
                and not (w.lane is not None and rec.get("reason") == "holder gone")
            ):
                w.violate(
                    "takeovers_true",
                    f"run {run_id}: {rec.name} written at {rec.created_at} although the lease "
                    f"it replaced ran until {expired}",
                    hole="new",
                )


def check_spend(w: W.World, ix: Index) -> None:
    """A run's recorded spend covers every response the provider billed it for, except
    the ones a crash lost before anything could record them."""
    billed: dict[str, int] = defaultdict(int)
    for bill in w.bills:
        # A deleted run's bills can still arrive from a drive that read it before the
        # delete; its journal is gone (``World.forget``).
        if bill.run is not None and not bill.lost and bill.run not in w.forgotten:
            billed[bill.run] += bill.tokens
    for run_id, tokens in sorted(billed.items()):
        spent = RunState.of(ix.records.get(run_id, [])).spend().total_tokens
        if spent < tokens:
            w.violate(
                "spend_covers_bills",
                f"run {run_id}: the journal records {spent} tokens, the provider billed {tokens}",
                hole="12",
            )


def check_forks(w: W.World, ix: Index) -> None:
    """Each fork is its own run with its own patch, and its patch reaches the model."""
    ids = [f["id"] for f in w.forks]
    for fork_id in sorted({i for i in ids if ids.count(i) > 1}):
        w.violate(
            "forks_distinct",
            f"{ids.count(fork_id)} forks were given the same id {fork_id}",
            hole="8",
        )
    for f in w.forks:
        names = ix.names.get(f["id"], {})
        rec = names.get("fork")
        if rec is not None and encode(rec.get("patch")) != encode(f["patch"]):
            w.violate(
                "forks_distinct",
                f"fork {f['id']} made by {f['by']} holds another fork's patch "
                f"({_short(rec.get('patch'), 50)})",
                hole="8",
            )
        append = f["patch"].get("append_user")
        if append and rec is not None and "fork:done" in names and not ids.count(f["id"]) > 1:
            messages = RunState.of(ix.records[f["id"]]).messages()
            if not any(m.role == "user" and m.content == append for m in messages):
                w.violate(
                    "forks_reach_model",
                    f"fork {f['id']} at step {f['step']}: the patch's message {append!r} is "
                    "not in the transcript the model gets",
                    hole="10",
                )
    for run_id in w.runs:
        row, names = ix.rows[run_id], ix.names[run_id]
        # The header and takeover records are bookkeeping beside the run's own records.
        records = [
            r
            for r in ix.records[run_id]
            if r.name != "@journal" and not r.name.startswith("@takeover/")
        ]
        if row is not None and row.forked_from and "fork" in names and records[0].name != "fork":
            w.violate(
                "forks_distinct",
                f"fork {run_id} of {row.forked_from} was driven while it was being copied: "
                f"its journal starts with {', '.join(r.name for r in records[:3])} before "
                "'fork', mixing a fresh run with the copy",
                hole="new",
            )
        if row is not None and row.forked_from and "fork" not in names and "model:1" in names:
            w.violate(
                "forks_distinct",
                f"fork {run_id} of {row.forked_from} died before its first record and was "
                "driven from the start, as a new run repeating the source's steps",
                hole="new",
            )


def check_agent_runs(w: W.World, ix: Index) -> None:
    """Only runs someone started act: never a session's journal, never a journal-only run."""
    for run_id in w.runs:
        row = ix.rows[run_id]
        # What the simulator knows it made, against the kind the engine gave the row (the
        # kind is what recovery and resume go by).
        expected = (
            "agent"
            if is_agent_run(run_id)
            else "session"
            if run_id.endswith(">session")
            else "journal"
        )
        if row is not None and row.kind != expected:
            w.violate(
                "only_agent_runs_run",
                f"{run_id} is a {expected} run, but its row says kind {row.kind!r}",
                hole="4" if expected == "session" else "new",
            )
        if is_agent_run(run_id):
            continue
        names = ix.names[run_id]
        if "run:start" in names or any(n.startswith("model:") for n in names):
            w.violate(
                "only_agent_runs_run",
                f"{run_id} was driven as an agent run (its journal has "
                f"{'model turns' if 'model:1' in names else 'run:start'})",
                hole="4" if run_id.endswith(">session") else "new",
            )
        elif run_id.endswith(">session") and row is not None and row.status != FINISHED:
            w.violate(
                "only_agent_runs_run",
                f"session journal {run_id} was left {row.status} (recovery's to pick up)",
                hole="4",
            )
    for e in w.ledger:
        if e.tool != "@step" and not is_agent_run(e.run):
            w.violate("only_agent_runs_run", f"{e.run} ran tool {e.tool}", hole="4")


def check_steps(w: W.World, ix: Index) -> None:
    """``Journal.step`` runs its function at most once per step name."""
    per_step: dict[tuple[str, str], int] = defaultdict(int)
    for e in w.ledger:
        if e.tool == "@step":
            per_step[(e.run, e.call)] += 1
    for (run_id, name), n in sorted(per_step.items()):
        if n > 1:
            w.violate(
                "steps_once", f"Journal.step {run_id}/{name} ran its function {n} times", hole="13"
            )


def check_imports(w: W.World, ix: Index) -> None:
    """An inert import is evidence (issue 31): whatever was tried on it, its row, journal,
    requests and halts are as the import wrote them; nobody held its lease; no tool ran
    for it; nothing was forked from it or made below it; recovery and the timer sweep
    never list it."""
    if not w.imports:
        return
    unfinished = {r.run_id for r in w.raw.list_unfinished(limit=10_000)}
    for run_id, was in w.imports.items():
        now = W.imported_state(w.raw, run_id, was.source)
        problems = []
        for what in ("status", "records", "requests", "halts"):
            if getattr(now, what) != getattr(was, what):
                problems.append(f"its {what} changed")
        if w.raw.get_lease(run_id) is not None:
            problems.append("a driver leased it")
        if any(e.run == run_id for e in w.ledger):
            problems.append("a tool ran for it")
        made = [
            r
            for r, row in ix.rows.items()
            if row is not None and run_id in (row.forked_from, row.parent_run_id)
        ]
        if made:
            problems.append(f"runs were made from it: {made}")
        if run_id in unfinished:
            problems.append("recovery lists it as work")
        for problem in problems:
            w.violate("imports_stay_inert", f"inert import {run_id}: {problem}", hole="new")


def check_spent(w: W.World) -> None:
    """No row ever comes back at an id the operator deleted (issue 41): not a client's retry,
    a fork named with it or after it, nor a live import of the run's own export."""
    for actor in w.actors:
        for run_id in getattr(actor, "deleted", {}):
            if w.raw.get_run(run_id) is not None:
                w.violate(
                    "spent_stay_spent",
                    f"run {run_id} was deleted by {actor.name}, and a run holds its id again",
                    hole="new",
                )


def check_pruning(w: W.World) -> None:
    """Retention's invariants at the end (``pruning.py``; ``prune_whole_trees`` is checked
    as each prune returns)."""
    from .pruning import check_pruned

    check_pruned(w)


def check_chains(w: W.World) -> None:
    """Every run's journal and the action log are one unbroken hash chain (docs/audit.md),
    whatever crashes, races and concurrent writers (decisions, signals) the schedule had."""
    for run_id in w.runs:
        report = verify_run(w.raw, run_id)
        if not report.ok or report.unchained:
            w.violate("chains_verify", f"run {run_id}: {report.message()}")
    actions = verify_actions(w.raw)
    if not actions.ok:
        w.violate("chains_verify", actions.message())


INVARIANTS = (
    "effects_once",
    "results_true",
    "approvals_kept",
    "quorums_need_people",
    "halts_stay_resolved",
    "halts_say_why",
    "rows_agree",
    "recovery_settles",
    "spend_covers_bills",
    "forks_distinct",
    "forks_reach_model",
    "only_agent_runs_run",
    "steps_once",
    "chains_verify",
    "imports_stay_inert",
    "imports_not_adopted",
    "spent_stay_spent",
    "pruned_stay_pruned",
    "prune_whole_trees",
    "cancels_reach_down",
    "sagas_undo_once",
    "saga_trees_close",
    "answers_bound",
    "stops_hold",
    "nothing_stranded",
    "lifecycle_moves",
    "limits_hold",
    "throttles_settle",
    "rules_hold",
    "expired_stays_expired",
    "one_person_one_vote",
    "notified_once_per_step",
    "webhooks_never_busy",
    "sessions_stay_open",
    "terminates",
    "no_internal_errors",
)


def _asks(names: dict[str, Record], name: str) -> list[tuple[str, Record | None]]:
    """The questions the interrupt ``name`` asked, in order: each one's prompt and answer."""
    out = []
    for rec in names.values():
        if rec.name.startswith("wait:") and rec.get("name") == name:
            if rec.get("kind") != "interrupt":
                return []
            ask = int(rec.get("ask") or 1)
            answer = names.get(f"input:{name}" if ask == 1 else f"input:{name}#{ask}")
            out.append((ask, str(rec.get("prompt")), answer))
    return [(prompt, answer) for _, prompt, answer in sorted(out, key=lambda a: a[0])]


def check_answers(w: W.World, ix: Index) -> None:
    """An answer is recorded once per question, for the question its answerer was shown
    (``answers_bound``: a question asked again in other words is a new one), first value
    wins; the call that asked a question returns the answer given to that question."""
    for (run_id, name), sent in w.answers.items():
        names = ix.names.get(run_id) or {}
        asks = _asks(names, name)
        for value, did, shown in sent:
            # (Sent with no question shown, as an API caller may: for whatever is asked.)
            given = [a for p, a in asks if shown in (p, None) and a is not None]
            values = [a.get("value") for a in given]
            if did == "recorded" and encode(value) not in {encode(v) for v in values}:
                w.violate(
                    "answers_bound",
                    f"run {run_id}: {value!r} was recorded for {name} as asked "
                    f"{shown!r}, and no answer to that question holds it (journal: "
                    f"{[(p, a.get('value') if a else None) for p, a in asks]})",
                    hole="29",
                )
            if did in ("same", "refused") and not given:
                w.violate("waits_first_value", f"run {run_id}: {name} {did} with nothing recorded")
            if did == "same" and encode(value) not in {encode(v) for v in values}:
                w.violate("waits_first_value", f"run {run_id}: {name}: {value!r} taken as the same")
            if did == "refused" and given and encode(value) == encode(given[-1].get("value")):
                w.violate("waits_first_value", f"run {run_id}: {name}: its own value refused")
            if did == "invalid" and value in ("yes", "no"):
                w.violate("waits_first_value", f"run {run_id}: a valid answer {value!r} refused")
        recorded: dict[Any, int] = defaultdict(int)
        for _, did, shown in sent:
            if did == "recorded":
                recorded[shown] += 1
        for shown, n in recorded.items():
            if n > sum(1 for p, _ in asks if shown in (p, None)):
                w.violate("waits_first_value", f"run {run_id}: {name} was recorded {n} times")
        for _, answer in asks:
            if answer is not None and answer.get("value") not in ("yes", "no"):
                w.violate(
                    "waits_first_value",
                    f"run {run_id}: an invalid answer {answer.get('value')!r} recorded",
                )
    for e in w.ledger:
        if e.tool != "confirm" or not isinstance(e.value, dict) or "prompt" not in e.value:
            continue
        asks = _asks(ix.names.get(e.run) or {}, str(e.value.get("wait")))
        answers = [a.get("value") for p, a in asks if p == e.value["prompt"] and a is not None]
        if encode(e.value.get("value")) not in {encode(v) for v in answers}:
            w.violate(
                "answers_bound",
                f"run {e.run}: call {e.call} asked {e.value['prompt']!r} and got "
                f"{e.value.get('value')!r}, which nobody answered to that question (journal: "
                f"{[(p, a.get('value') if a else None) for p, a in asks]})",
                hole="29",
            )


def _check_timed_out(
    w: W.World, names: dict[str, Record], run_id: str, wait: Record, waited: Record
) -> None:
    """A signal wait resolved by its deadline (issue 32): only a wait with a deadline times
    out, never before it (by the store's clock), never over a signal delivered before it, and
    the call that awaited it got the timeout."""
    name, call = wait.get("name"), wait.get("call_id")
    deadline = wait.get("deadline_ms")
    if deadline is None:
        w.violate("timers_never_early", f"run {run_id}: signal {name} with no deadline timed out")
        return
    w.count("signal waits timed out")
    at = waited.created_at
    if at is not None and at.timestamp() * 1000 < int(deadline):
        w.violate(
            "timers_never_early",
            f"run {run_id}: signal {name} timed out at {at.timestamp() * 1000:.0f}, before its "
            f"deadline {deadline}",
        )
    delivered = names.get(f"signal:{name}")
    if (
        delivered is not None
        and delivered.created_at is not None
        and delivered.created_at.timestamp() * 1000 < int(deadline)
        and delivered.seq < waited.seq
    ):
        w.violate(
            "signals_consumed_once",
            f"run {run_id}: signal {name} was delivered before its deadline, and the wait "
            "timed out over it",
        )
    if waited.get("call_id") != call:
        w.violate(
            "signals_consumed_once",
            f"run {run_id}: the timeout of {name} awaited by {call} went to "
            f"{waited.get('call_id')}",
        )
    result = names.get(f"tool:{call}")
    if result is None or result.get("is_error") or result.get("reconciled"):
        return
    got = (result.get("result") or {}).get("value")
    if encode(got) != encode(TIMED_OUT):
        w.violate(
            "waits_first_value",
            f"run {run_id}: call {call} returned {got!r} for {name}, which timed out",
        )


def check_waits(w: W.World, ix: Index) -> None:
    """An answer or a signal is recorded once, the first one wins everywhere (the journal,
    the tool's result), and a signal is consumed by the one call that awaited it."""
    check_answers(w, ix)
    for (run_id, name), sent in w.signals.items():
        names = ix.names.get(run_id) or {}
        rec = names.get(f"signal:{name}")
        journaled = rec.get("payload") if rec is not None else None
        recorded = [v for v, did in sent if did == "recorded"]
        if len(recorded) > 1:
            w.violate(
                "waits_first_value", f"run {run_id}: {name} was recorded {len(recorded)} times"
            )
        if recorded and (rec is None or encode(recorded[0]) != encode(journaled)):
            w.violate(
                "waits_first_value",
                f"run {run_id}: {name} was recorded as {recorded[0]!r}, the journal holds "
                f"{journaled!r}",
            )
        for _, did in sent:
            if did == "duplicate" and rec is None:
                w.violate("waits_first_value", f"run {run_id}: {name} {did} with nothing recorded")
    for run_id in w.runs:
        names = ix.names.get(run_id) or {}
        for rec in names.values():
            if not rec.name.startswith("wait:"):
                continue
            name, call = rec.get("name"), rec.get("call_id")
            waited = names.get(f"waited:{name}")
            if rec.get("kind") == "timer":
                # Early only by a person's decision (wake_timer), which says so and who.
                staff = waited is not None and waited.get("early") and waited.get("by")
                if staff and int(waited.get("woke_ms")) >= int(rec.get("wake_ms")):
                    w.violate(
                        "timers_never_early",
                        f"run {run_id}: timer {name} marked woken early by {waited.get('by')} "
                        "at or after its time",
                    )
                if (
                    waited is not None
                    and not staff
                    and int(waited.get("woke_ms")) < int(rec.get("wake_ms"))
                ):
                    w.violate(
                        "timers_never_early",
                        f"run {run_id}: timer {name} woke at {waited.get('woke_ms')}, before "
                        f"its journaled {rec.get('wake_ms')}",
                    )
                continue
            if rec.get("kind") == "interrupt":
                continue  # ``check_answers``: each question's answer, by the ledger
            if waited is not None and waited.get("outcome") == "timeout":
                _check_timed_out(w, names, run_id, rec, waited)
                continue
            if waited is not None and waited.get("call_id") != call:
                w.violate(
                    "signals_consumed_once",
                    f"run {run_id}: signal {name} awaited by {call} was consumed by "
                    f"{waited.get('call_id')}",
                )
            delivered = names.get(f"signal:{name}")
            if waited is not None and (
                delivered is None
                or encode(waited.get("payload")) != encode(delivered.get("payload"))
            ):
                w.violate(
                    "signals_consumed_once", f"run {run_id}: {name} resolved to another payload"
                )
            result = names.get(f"tool:{call}")
            if result is None or result.get("is_error") or result.get("reconciled"):
                continue
            want = waited.get("payload") if waited is not None else None
            got = (result.get("result") or {}).get("value")
            if waited is None or encode(got) != encode(want):
                w.violate(
                    "waits_first_value",
                    f"run {run_id}: call {call} returned {got!r} for {name}, the journal "
                    f"resolved it to {want!r}",
                )
    # After the quiet phase's sweeps, no run is left paused on waits that are all answered
    # (an answerer that crashed between its record and its hand-over is made up for).
    journal = Journal(w.raw)
    for run_id in w.runs:
        row = w.raw.get_run(run_id)
        paused = row is not None and row.status in (AWAITING_INPUT, SLEEPING)
        if paused and all_answered(journal.records(run_id)):
            w.violate(
                "waits_not_stranded",
                f"run {run_id} is {row.status} though every wait it has is answered",
            )
    consumed: dict[tuple[str, Any], list[str]] = defaultdict(list)
    for e in w.ledger:
        if e.tool == "confirm" and isinstance(e.value, dict):
            consumed[(e.run, e.value.get("wait"))].append(e.call)
    for (run_id, name), calls in consumed.items():
        if len(set(calls)) > 1:
            w.violate(
                "signals_consumed_once",
                f"run {run_id}: {name} was returned to calls {sorted(set(calls))}",
            )


def check_channels(w: W.World, ix: Index) -> None:
    """A channel's key is recorded once with its first payload (a redelivery gets that one
    back), and each message is received in the channel's order and acked at most once: the
    one ``confirm`` call that read the channel returned its oldest message, and the ack of
    that message names that call."""
    for (run_id, channel), sent in w.messages.items():
        journal = ix.names.get(run_id) or {}
        for key in {k for k, _, _ in sent}:
            rec = journal.get(f"message:{channel}:{key}")
            mine = [(p, did) for k, p, did in sent if k == key]
            if sum(1 for _, did in mine if did == "recorded") > 1:
                w.violate("channels_in_order", f"run {run_id}: {channel}/{key} recorded twice")
            for payload, did in mine:
                if did in ("recorded", "duplicate") and (
                    rec is None or encode(payload) != encode(rec.get("payload"))
                ):
                    w.violate(
                        "channels_in_order",
                        f"run {run_id}: {channel}/{key} {did} as {payload!r}, the journal holds "
                        f"{None if rec is None else rec.get('payload')!r}",
                    )
    for run_id in w.runs:
        journal = ix.names.get(run_id) or {}
        ordered = sorted(
            (r for r in journal.values() if r.name.startswith("message:")), key=lambda r: r.seq
        )
        got: dict[str, list[str]] = defaultdict(list)
        for e in w.ledger:
            if (
                e.run == run_id
                and e.tool == "confirm"
                and isinstance(e.value, dict)
                and ("key" in e.value)
            ):
                got[e.call].append(f"{e.value.get('wait')}:{e.value.get('key')}")
        for call, received in got.items():
            channel = received[0].partition(":")[0]
            keys = [str(r.get("key")) for r in ordered if r.name.startswith(f"message:{channel}:")]
            # Each run of the call got the oldest message nothing acked: the first message,
            # then the same (a crash before its ack) or the next one (acked, then a crash).
            at = [
                keys.index(k.partition(":")[2]) if k.partition(":")[2] in keys else -1
                for k in received
            ]
            if at[0] != 0 or any(b not in (a, a + 1) for a, b in pairwise(at)):
                w.violate(
                    "channels_in_order",
                    f"run {run_id}: call {call} received {received}, the channel holds {keys}",
                )
            # The tool writes what it got to the ledger, then acks: a run of the call that
            # died in between, or whose ack was fenced out (a driver that had lost the run),
            # leaves that message unacked. The message the call's journaled result holds was
            # acked by the call.
            result = journal.get(f"tool:{call}")
            value = (result.get("result") or {}) if result is not None else {}
            kept = value.get("key") if isinstance(value, dict) else None
            for k in {k for k in received if kept is not None and k.partition(":")[2] == kept}:
                ack = journal.get(f"ack:{k}")
                if ack is None or ack.get("call_id") != call:
                    w.violate(
                        "channels_in_order",
                        f"run {run_id}: {k} acked by "
                        f"{None if ack is None else ack.get('call_id')}, received by {call}",
                    )


def check_trees(w: W.World, ix: Index) -> None:
    """A sub-run (``agent.as_tool()``) sits where its journal says: its row's parent and root
    are its ``run:start``'s, its id is ``<parent>/<call>``, its parent journaled starting it
    (``child:<call>``) and its root is its parent's root; a parent's result for the call is
    the sub-run's answer."""
    for run_id in w.runs:
        row = ix.rows[run_id]
        if row is None or row.parent_run_id is None:
            continue
        parent, root = row.parent_run_id, row.root_run_id
        start = ix.names[run_id].get("run:start")
        if start is not None and (start.get("parent"), start.get("root")) != (parent, root):
            w.violate(
                "tree_agrees",
                f"{run_id}: its row says parent {parent!r}, root {root!r}; its run:start "
                f"says {start.get('parent')!r}, {start.get('root')!r}",
            )
        call = run_id.removeprefix(f"{parent}/")
        if call == run_id:
            w.violate("tree_agrees", f"{run_id} is not named after its parent {parent!r}")
            continue
        names = ix.names.get(parent) or _names(w, parent)
        parent_row = ix.rows.get(parent) or w.raw.get_run(parent)
        if parent_row is not None and parent_row.forked_from and "fork:done" not in names:
            # A half-made fork (its maker died or lost its lease while copying): the forks of
            # its sub-runs are made first, its own ``child:`` records last. The fork stays
            # failed (``history.fork_incomplete``) and its sub-runs wait for a parent that
            # never drives them: legal, as long as nobody drove them on their own.
            _never_driven_alone(w, ix, run_id, parent)
            continue
        # (A fork's copy of the record names its source's sub-run: first writer wins.)
        child = names.get(f"child:{call}")
        if child is None or child.get("call_id") != call:
            w.violate("tree_agrees", f"{parent} never journaled starting its sub-run {run_id}")
        if parent_row is not None and root != (parent_row.root_run_id or parent):
            w.violate("tree_agrees", f"{run_id}'s root {root!r} is not its parent's root")
        result = names.get(f"tool:{call}")
        complete = ix.names[run_id].get("run:complete")
        settled = result is not None and not result.get("is_error")
        if (
            settled
            and not result.get("reconciled")
            and (complete is None or result.get("result") != complete.get("answer"))
        ):
            w.violate(
                "tree_agrees",
                f"{parent}'s result for {call} is not the answer of its sub-run {run_id}",
            )


def _never_driven_alone(w: W.World, ix: Index, run_id: str, parent: str) -> None:
    """A sub-run forked for a fork that was never completely made has nothing after its own
    copy (``fork:done``): only its parent may drive it, and its parent never will."""
    records = ix.records.get(run_id) or Journal(w.raw).records(run_id)
    done = next((r for r in records if r.name == "fork:done"), None)
    # Its stop, when the half-made fork was cancelled or aborted, it records itself (issue
    # 29): its rollback undoes nothing it copied (a fork's copies are its source's).
    stop = ("saga:abort", "run:compensated", "run:cancelled", "compensate:", "attempt:compensate:")
    after = [
        r.name
        for r in records
        if done is not None
        and r.seq > done.seq
        and not r.name.startswith(stop)
        and not r.name.startswith("@")
    ]
    if after:
        w.violate(
            "tree_agrees",
            f"{run_id}, forked for the half-made fork {parent}, was driven on its own: {after}",
        )


def saga_violations(records: list[Record]) -> list[str]:
    """What is wrong with one run's saga records (``docs/composition.md``): an undo
    (``compensate:<call>``) only after the abort, only for a call whose ``tool:<call>`` is a
    success (or, for the rollback of a sub-run, a call that started one: whatever its
    outcome, placed as the latest if it has none), at most one claim that ran it (a
    person's resolution claim aside), latest completed call first; and after the abort no
    step of the forward path."""
    problems: list[str] = []
    names = {rec.name: rec for rec in records}
    abort = names.get("saga:abort")
    undos = [rec for rec in records if rec.name.startswith("compensate:")]
    claims: dict[str, int] = defaultdict(int)
    for rec in records:
        if rec.name.startswith("attempt:compensate:") and not rec.get("resolution"):
            claims[rec.name.removeprefix("attempt:").rpartition(":")[0]] += 1
    for op, n in claims.items():
        if n > 1:
            problems.append(f"{op} was claimed to run {n} times")
    if abort is None:
        if undos or claims:
            problems.append("undone without a journaled abort")
        return problems
    for rec in records:
        if rec.seq <= abort.seq:
            continue
        forward = rec.name.startswith("model:") or (
            rec.name.startswith("tool:") and not rec.get("reconciled")
        )
        if forward:
            problems.append(f"{rec.name} was written after the abort")
    done_at: list[float] = []
    for rec in undos:
        call = rec.name.removeprefix("compensate:")
        result = names.get(f"tool:{call}")
        if rec.seq < abort.seq:
            problems.append(f"{rec.name} came before the abort")
        undid = rec.get("result")
        if isinstance(undid, dict) and "sub_run" in undid:
            if f"child:{call}" not in names:
                problems.append(f"{rec.name} rolled back a sub-run the call never started")
            done_at.append(result.seq if result is not None else math.inf)
            continue
        if result is None or result.get("is_error"):
            problems.append(f"{rec.name} undid a call with no successful result")
            continue
        done_at.append(result.seq)
    if any(a < b for a, b in pairwise(done_at)):
        problems.append("undos not in reverse order of the calls' completion")
    return problems


def check_sagas(w: W.World, ix: Index) -> None:
    """``saga_violations`` for every run (an undo only of a call whose journaled outcome is
    a success); and in the ledger, outside the journal: each undo took effect at most once,
    only in a run whose abort is journaled, and only of a call the run itself invoked (a
    fork's copied calls are its source's to undo; a keyed call its downstream deduped against
    another run's was invoked by this run, and is this run's to undo)."""
    for run_id, records in ix.records.items():
        for problem in saga_violations(records):
            w.violate("sagas_undo_once", f"{run_id}: {problem}")
    undone: dict[tuple[str, str], int] = defaultdict(int)
    made = {(e.run, e.call) for e in w.ledger if e.tool not in UNDOS}
    for e in w.ledger:
        if e.tool not in UNDOS or not e.effect:
            continue
        undone[(e.run, e.call)] += 1
        if "saga:abort" not in ix.names.get(e.run, {}):
            w.violate("sagas_undo_once", f"{e.run}: {e.call} ran with no abort journaled")
        # A run undoes only what it invoked itself: a fork's copied calls are its source's.
        if (e.run, e.call.removeprefix("compensate:")) not in made:
            w.violate("sagas_undo_once", f"{e.run}: {e.call} undid a call this run never made")
    # Issue 43: an undo is given the arguments its call ran with (an approver's edit
    # included), never the ones the model asked for.
    # (An undo deployed after its call ran gets the arguments with its own code's defaults
    # filled in, as a call of that code would: a refund run before ``reason`` existed is
    # undone with the default reason; fresh seed 50000217.)
    ran = {(e.run, e.call): e.args for e in w.ledger if e.tool not in UNDOS}
    for e in w.ledger:
        if e.tool not in UNDOS or not e.effect:
            continue
        fired = ran.get((e.run, e.call.removeprefix("compensate:")))
        if fired is not None:
            fired = {**_UNDO_DEFAULTS, **fired} if set(e.args) - set(fired) else fired
        if fired is not None and encode(fired) != encode(e.args):
            w.violate(
                "sagas_undo_once",
                f"{e.run}: {e.call} undid {_short(e.args)}, but the call ran with {_short(fired)}",
            )
    for (run_id, call), n in undone.items():
        if n > 1:
            w.violate("sagas_undo_once", f"{run_id}: {call} took effect {n} times")
    check_saga_trees_closed(w, ix)


# The defaults a deploy's refund declares (``agent.refund_v2``): what its undo is given for an
# argument the call ran without.
_UNDO_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(refund_v2).parameters.items()
    if p.default is not inspect.Parameter.empty
}


def check_saga_trees_closed(w: W.World, ix: Index) -> None:
    """A run that ended ``compensated`` leaves none of its own sub-runs able to go on: each
    finished, failed, was aborted with it or cancelled, and none has an approval request
    still pending (an approval would fire an effect of a tree that was undone)."""
    ended = {run_id for run_id, names in ix.names.items() if "run:compensated" in names}
    if not ended:
        return
    pending = {r.run_id for r in ix.requests if r.status == "pending"}
    for child, row in ix.rows.items():
        if row is None or row.parent_run_id not in ended:
            continue
        names = ix.names.get(child, {})
        stopped = any(n in names for n in ("run:complete", "saga:abort", "run:cancelled"))
        if not stopped and row.status != "failed":
            w.violate(
                "saga_trees_close",
                f"{child}: its parent {row.parent_run_id} ended compensated, and it is "
                f"{row.status} with nothing stopping it",
            )
        if child in pending:
            w.violate(
                "saga_trees_close",
                f"{child}: its parent {row.parent_run_id} ended compensated, and an approval "
                "request of it is still pending",
            )


STOPS = ("run:cancelled", "saga:abort")


def _stops_at_and_above(w: W.World, ix: Index, run_id: str | None) -> list[tuple[str, Record]]:
    """The stop records (``run:cancelled``, ``saga:abort``) of ``run_id`` and its ancestors."""
    out: list[tuple[str, Record]] = []
    seen: set[str] = set()
    while run_id and run_id not in seen:
        seen.add(run_id)
        names = ix.names.get(run_id) or _names(w, run_id)
        out += [(run_id, names[n]) for n in STOPS if n in names]
        row = ix.rows.get(run_id) or w.raw.get_run(run_id)
        run_id = row.parent_run_id if row is not None else None
    return out


def stop_at_or_above(w: W.World, run_id: str) -> tuple[str, str] | None:
    """A stop recorded in ``run_id`` or a run above it, read now: (that run, the record's
    name), or None."""
    seen: set[str] = set()
    current: str | None = run_id
    while current and current not in seen:
        seen.add(current)
        for name in STOPS:
            if w.raw.get(current, name) is not None:
                return current, name
        row = w.raw.get_run(current)
        current = row.parent_run_id if row is not None else None
    return None


# Every status a run waits in with nobody driving it: throttled too (issue 41).
PAUSED_STATUSES = (AWAITING_APPROVAL, AWAITING_INPUT, SLEEPING, HALTED, THROTTLED)


def _stopped_ancestor(w: W.World, parent: str | None) -> str | None:
    """The nearest of ``parent`` and its ancestors whose journal holds a stop, or None."""
    seen: set[str] = set()
    while parent and parent not in seen:
        seen.add(parent)
        if any(w.raw.get(parent, n) is not None for n in STOPS):
            return parent
        row = w.raw.get_run(parent)
        parent = row.parent_run_id if row is not None else None
    return None


def _left_below_a_stop(w: W.World) -> dict[str, tuple[str, datetime | None, str]]:
    """Paused runs, throttled included, that nobody holds and that have not recorded the
    stop recorded above them: run -> (status, its row's last change, the stopped run)."""
    out = {}
    for row in w.raw.list_unfinished(limit=10_000, statuses=PAUSED_STATUSES):
        if not row.parent_run_id or any(w.raw.get(row.run_id, n) is not None for n in STOPS):
            continue
        lease = w.raw.get_lease(row.run_id)
        holder = _stopped_ancestor(w, row.parent_run_id)
        if holder is not None and (lease is None or not lease.live):
            out[row.run_id] = (row.status, row.updated_at, holder)
    return out


def sweep_reaches_down(w: W.World, sweep: Any) -> Any:
    """Run a sweep (``wake_timers``) and hold it to the promise it makes a stopped tree
    (``cancels_reach_down``, issue 41): a cancel that died before reaching a run below it
    is finished by the next sweep, not later. Each run that, when the sweep began, was
    paused (throttled too) below a recorded stop it had not recorded itself, and that
    nobody took or moved meanwhile, was handed over. (A throttled sub-run of a cancelled
    root otherwise waits for its retry: a day, for a rate of 1/d.)"""
    before = _left_below_a_stop(w)
    taken = len(w.leases_taken)
    woken = sweep()
    held = set(w.leases_taken[taken:])
    for run_id, (status, changed, holder) in before.items():
        row = w.raw.get_run(run_id)
        if row is None or run_id in held or (row.status, row.updated_at) != (status, changed):
            continue
        if any(w.raw.get(run_id, n) is not None for n in STOPS):
            continue
        w.violate(
            "cancels_reach_down",
            f"a sweep left {run_id} {status} below {holder}'s stop, which it has not "
            "recorded: the cancel above it died, and the sweep did not finish it",
            hole="new",
        )
    return woken


def check_adoptions(w: W.World, ix: Index) -> None:
    """An import is nobody's sub-run (issue 41): a call whose sub-run id an import aimed at
    it holds never has the import's answer for its result. If it has a result, it is an
    error naming the refusal (``subagent.imported``), whatever path ran the call: its
    first drive, a drive after a crash, recovery, the sweep, a fork's reference."""
    if not w.aimed_imports:
        return
    for run_id, names in ix.names.items():
        for name, rec in names.items():
            if not name.startswith("model:"):
                continue
            for call in (rec.get("message") or {}).get("tool_calls") or ():
                if call.get("name") != ERRAND:
                    continue
                call_id = str(call.get("id"))
                child = names.get(f"child:{call_id}")
                sub = str(child.get("run_id")) if child is not None else f"{run_id}/{call_id}"
                answer = w.aimed_imports.get(sub)
                result = names.get(f"tool:{call_id}")
                if answer is None or result is None or result.get("patched"):
                    continue
                said = encode(result.get("result"))
                if not result.get("is_error") or answer in said:
                    problem = "took the answer of the import"
                elif "subagent.imported" not in said:
                    problem = f"failed without naming the import ({_short(said)})"
                else:
                    continue
                w.violate(
                    "imports_not_adopted",
                    f"{run_id}: call {call_id} {problem} {sub} holds at its sub-run's id",
                    hole="new",
                )


def check_limits(w: W.World, ix: Index) -> None:
    """Limits (``engine.limits``). At once (checked as each model call or tool body begins,
    ``World.work_begins``): never more runs of the limited agent driven than its
    ``max_concurrent_runs``, nor calls of a limited tool in flight than its
    ``max_concurrent``. Here: a rate-limited tool (or the model) ran no more often than its
    rate lets calls through — a burst of ``count``, then one per ``period/count`` (GCRA): any
    ``k`` calls span at least ``(k - count) * period / count`` seconds of the virtual clock.
    And once the world settles, no run is left throttled: its retry came due and the sweep
    handed it over, or a slot given back did."""
    limits = w.limits()
    if limits is not None:
        rates = {f"model/{W.MODEL_ID}": limits.model_rate}
        if limits.tool and limits.tool_rate:
            rates[f"tool/{limits.tool}"] = limits.tool_rate
        for key, text in rates.items():
            if text is None:
                continue
            rate = parse_rate(text, key)
            times = sorted(w.admitted.get(key, []))
            for i, first in enumerate(times):
                for j in range(i + rate.count, len(times)):
                    k = j - i + 1
                    if times[j] - first < (k - rate.count) * rate.interval - 1e-6:
                        w.violate(
                            "limits_hold",
                            f"{key} ({text}) let {k} calls through in "
                            f"{times[j] - first:.2f}s (t={first - W.EPOCH:.1f}-"
                            f"{times[j] - W.EPOCH:.1f}): its rate allows "
                            f"{rate.count} + {(times[j] - first) / rate.interval:.2f}",
                            hole="new",
                        )
                        break
    for run_id, row in ix.rows.items():
        if row is not None and row.status == THROTTLED:
            waits = [t for t in w.raw.list_throttled(limit=1000) if t.run_id == run_id]
            why = (
                f"waits for {waits[0].key} ({waits[0].reason}), retry at "
                f"t={waits[0].retry_at.timestamp() - W.EPOCH:.1f}"
                if waits
                else "no throttle row says what it waits for"
            )
            w.violate(
                "throttles_settle",
                f"run {run_id} is left throttled after recovery passes and sweeps: {why}",
                hole="new",
            )


def check_stops(w: W.World, ix: Index) -> None:
    """A stop holds for the whole tree (``engine.stops``): no tool call of a run (an undo
    aside) begins after its own or an ancestor's ``run:cancelled`` or ``saga:abort`` was
    recorded; after the quiet phase, no run below a stopped one is left able to go on (each
    ended, failed, or recorded a stop of its own), and no run is left queued, running or
    compensating: recovery picks every one of them up."""
    for e in w.ledger:
        if e.tool in UNDOS or not is_agent_run(e.run) or e.run not in ix.rows:
            continue
        for holder, rec in _stops_at_and_above(w, ix, e.run):
            # A run's own stop is checked when its drive begins: a call it claimed before
            # the stop was in flight (a stalled driver runs it; the rollback halts on it).
            # A stop above is checked after the claim, right before the call runs.
            began = e.claimed if holder == e.run and e.claimed else e.entered
            if rec.seq <= began:
                w.violate(
                    "stops_hold",
                    f"{e.run}: {e.tool} call {e.call} began after {holder}'s {rec.name} "
                    f"(record seq {rec.seq}, the call began after seq {began})",
                    hole="29",
                )
    for run_id, row in ix.rows.items():
        if row is None or not is_agent_run(run_id):
            continue
        if row.status in ("queued", "running", "compensating"):
            w.violate(
                "nothing_stranded",
                f"run {run_id} is left {row.status} after recovery passes and sweeps",
                hole="29",
            )
        if not row.parent_run_id or row.status in TERMINAL_STATUSES or row.status == FAILED:
            continue
        names = ix.names.get(run_id, {})
        if any(n in names for n in STOPS):
            continue
        above = _stops_at_and_above(w, ix, row.parent_run_id)
        if above:
            holder, rec = above[0]
            w.violate(
                "nothing_stranded",
                f"{run_id} is {row.status} below {holder}'s {rec.name}, and never recorded a "
                "stop of its own",
                hole="29",
            )


# -- approval rules (issue 42: ``rulecast.py``) ---------------------------------------------


def _need(outcome: str, policy: Any) -> int | None:
    """Approvals a rule's outcome needs: 0 (allow), ``need`` (ask), None (deny)."""
    if outcome == "deny":
        return None
    if outcome == "allow":
        return 0
    return int((policy or {}).get("need", 1))


def _runs_with(rec: Record) -> Any:
    return (rec.get("edited") or {}).get("arguments") or rec.get("arguments")


def _named(names: dict[str, Record], prefix: str, call_id: str) -> dict[str, Record]:
    head = f"{prefix}:{call_id}"
    return {n: r for n, r in names.items() if n == head or n.startswith(head + ":")}


def check_rules(w: W.World, ix: Index) -> None:
    """``rules_hold``: no refund gated by rules fires with fewer distinct approvers than the
    rule of the arguments it fires with needs, nor with fewer than its request needed when
    it was asked (a pending request's needs only grow: an edit or a deploy never lowers
    them), nor with arguments its rule denies. Judged from the ledger (what fired, with what)
    and the journal (which rule asked, who approved what); a rule the journal does not hold
    for the fired arguments is evaluated under each version of the rules deployed when a
    person decided the call (the laxest, so a deploy is never held against the engine)."""
    if not w.groups:
        return
    from .agent import RULES

    versions = {p.fingerprint: p for p in RULES.values()}
    for e in w.ledger:
        if e.tool != "refund" or e.run not in ix.names:
            continue
        names = ix.names[e.run]
        asked = _named(names, "rule", e.call)
        if not asked:
            continue  # not gated by rules (an errand's refund)
        approvals = [r for r in _named(names, "approval", e.call).values() if r.get("approved")]
        if not approvals:
            continue  # ``approvals_kept`` says so
        fitting = [r for r in approvals if _runs_as(_runs_with(r), e.args)] or approvals
        before = [r for r in fitting if r.seq <= e.entered] or fitting
        decision = max(before, key=lambda r: r.seq)
        suffix = decision.name[len(f"approval:{e.call}") :]
        asking = names.get(f"rule:{e.call}{suffix}")
        floor = _need(str(asking.get("outcome")), asking.get("policy")) if asking else 0
        own = asked.get(f"rule:{e.call}:{arguments_tag(e.args)}")
        if own is None and asking is not None and _runs_as(asking.get("arguments"), e.args):
            own = asking
        if own is not None:
            needed = _need(str(own.get("outcome")), own.get("policy"))
        else:
            tried = w.rule_versions.get((e.run, e.call)) or {w.deploy.rules}
            policies = [
                p
                for p in RULES.values()
                if any(p is RULES.get((v, w.deploy.expiry)) for v in tried)
            ] or list(versions.values())
            if decision.get("fingerprint") in versions:  # the rules that decided it
                policies = [versions[str(decision.get("fingerprint"))]]
            got = [_evaluated_need(p, e.args) for p in policies]
            needed = None if all(g is None for g in got) else min(g for g in got if g is not None)
        if needed is None or floor is None:
            w.violate(
                "rules_hold",
                f"run {e.run}: refund {e.call} fired as {encode(e.args)}, which its rules deny",
                hole="new",
            )
            continue
        required = max(needed, floor)
        if decision.get("automatic"):
            approvers: set[str] = set()
        else:
            entries = list((decision.get("tally") or {}).get("decisions") or ())
            approvers = {
                str(d.get("approver"))
                for d in entries
                if d.get("approved")
                and _runs_as(d.get("arguments", decision.get("arguments")), e.args)
            }
            if not entries:
                approvers = {str(decision.get("by"))}
        if len(approvers) < required:
            w.violate(
                "rules_hold",
                f"run {e.run}: refund {e.call} fired as {encode(e.args)} approved by "
                f"{sorted(approvers) or 'nobody'} ({decision.name}); it needed {required} "
                f"(the rule of those arguments {needed}, the request when asked {floor})",
                hole="new",
            )
        else:
            w.count(f"rules: refunds fired under rules with {required} approvals needed")


def _evaluated_need(policy: Any, args: Any) -> int | None:
    from durable_agents.engine.rules import RuleContext

    match = policy.evaluate(args, RuleContext(agent="", run_id="", tool="refund"))
    return _need(match.outcome.kind, match.policy)


def check_expiries(w: W.World, ix: Index) -> None:
    """``expired_stays_expired``: a request that expired (its row seen ``expired``, or its
    expiry journaled as the call's decision) is never approved afterwards — its decision
    (the one name a decision on that asking has) is no approval — and its call never fires
    with its arguments unless another asking of the call was approved for them."""
    expired: dict[tuple[str, str, str], Any] = dict(w.expired_rows)
    for run_id, names in ix.names.items():
        for name, rec in names.items():
            if name.startswith("approval:") and rec.get("expired"):
                expired.setdefault((run_id, str(rec.get("call_id")), name), rec.get("arguments"))
    for (run_id, call_id, name), args in sorted(expired.items(), key=lambda kv: kv[0]):
        names = ix.names.get(run_id)
        if names is None:
            continue
        w.count("rules: requests expired")
        rec = names.get(name)
        if rec is not None and rec.get("approved"):
            w.violate(
                "expired_stays_expired",
                f"run {run_id}: the request of {call_id} expired, and {name} approves it "
                f"(by {rec.get('by')!r})",
                hole="new",
            )
        approved = [
            r
            for n, r in _named(names, "approval", call_id).items()
            if n != name and r.get("approved")
        ]
        for e in ix.by_call.get((run_id, call_id), ()):
            if e.tool != "refund" or not _runs_as(args, e.args):
                continue
            if any(_runs_as(_runs_with(r), e.args) for r in approved):
                continue  # another asking of the call was approved for these arguments
            w.violate(
                "expired_stays_expired",
                f"run {run_id}: the request of {call_id} expired, and the call fired as "
                f"{encode(e.args)}",
                hole="new",
            )


def check_votes(w: W.World, ix: Index) -> None:
    """``one_person_one_vote``: in every decision journaled, one person counts once, whatever
    the path — for themselves, as a deputy for one or more approvers, from a second tab: the
    counted votes' makers (the deputy, or the approver) are distinct, and a passed quorum
    rests on as many distinct makers as it needs."""
    for run_id, names in ix.names.items():
        for name, rec in names.items():
            tally_ = rec.get("tally") if rec.get("kind") == "approval" else None
            if not isinstance(tally_, dict):
                continue
            entries = list(tally_.get("decisions") or ())
            makers = [str(d.get("deputy") or d.get("approver")) for d in entries]
            twice = sorted({m for m in makers if makers.count(m) > 1})
            if twice:
                w.violate(
                    "one_person_one_vote",
                    f"run {run_id}: {name} counts {', '.join(twice)} more than once "
                    f"({[(d.get('approver'), d.get('deputy')) for d in entries]})",
                    hole="new",
                )
            if rec.get("approved") and not rec.get("automatic"):
                need = int(tally_.get("need") or 1)
                hands = {
                    str(d.get("deputy") or d.get("approver"))
                    for d in entries
                    if d.get("approved") and d.get("approver") in (tally_.get("approved_by") or ())
                }
                if entries and len(hands) < need:
                    w.violate(
                        "one_person_one_vote",
                        f"run {run_id}: {name} passed a quorum of {need} on the votes of "
                        f"{sorted(hands)}",
                        hole="new",
                    )
                if any(d.get("deputy") for d in entries):
                    w.count("rules: decisions counting a deputy's vote")


STEP_EVENTS = ("approval_reminded", "approval_escalated", "approval_expired")


def check_notifications(w: W.World) -> None:
    """``notified_once_per_step``: each deadline step of a request (remind, escalate,
    expire) is announced once — by the process whose write made it true — whatever
    sweeps raced, crashed and came again (the host's signals, and the notification outbox
    rows they project, are one per request, step and kind)."""
    seen: dict[tuple[str, ...], int] = {}
    for event, details, pid in w.announced:
        if event not in STEP_EVENTS:
            continue
        key = (
            event,
            str(details.get("run_id")),
            str(details.get("call_id")),
            encode(details.get("arguments")),
            str(details.get("step")),
            encode(details.get("_asked")),
        )
        if key in seen:
            w.violate(
                "notified_once_per_step",
                f"run {key[1]}: {event} of call {key[2]} ({key[4]}) announced again (processes "
                f"{seen[key]} and {pid})",
                hole="new",
            )
        else:
            seen[key] = pid
            w.count(f"rules: {event} announced")
