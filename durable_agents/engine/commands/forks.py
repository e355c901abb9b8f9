"""Forks: "what if the tool had said something else?" (reading a run as steps, and
comparing two, is ``engine.steps``.)

* ``fork(run_id, from_step, patch)`` — a new run whose journal is the source's up to a step
  (copied, plus a ``fork`` record), with a patch applied: replace a recorded tool result in
  place, record a result for a call that has none, append a user message, or replace the
  instructions. The source is not touched. Calls left without a result run on resume
  through the normal path, approval included: an old approval does not carry over. A call
  whose side effect's outcome is unknown in the source (a live attempt) is unknown in the
  fork too: the fork carries the attempt and halts on it, unless the patch records a result
  for that call. A fork keeps its source's origin, so a call's idempotency key is the same
  in a run and in all its forks. A fork is runnable only once it is completely copied: its
  row says ``failed`` (``history.fork_incomplete``) until ``fork:done``, so a fork whose
  maker died is never driven from its input or from a partial journal. The sub-runs its
  copied calls started are referenced (ended) or forked under the fork's id (unfinished)
  first: ``tree_forks``.
* ``fork_session(session, from_turn)`` — a new session whose transcript is the first turns
  of another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import failpoints, identity, lifecycle, names, runtime
from ..errors import ConfigError, Conflict, NotFound, RunBusy, RunIdSpent
from ..imported import refuse_inert
from ..journal import Journal
from ..leases import HeldLease
from ..loop import announce_halts, unknown_outcomes
from ..ports import (
    AWAITING_INPUT,
    FAILED,
    HALTED,
    KIND_AGENT,
    QUEUED,
    ActionInfo,
    RunInfo,
    Store,
)
from ..records import Record, encode, validate_run_id
from ..session_log import SessionLog
from ..steps import check_step, prefix
from ..transcript import RunState
from ..tree import child_run_id
from . import tree_forks


@dataclass(frozen=True)
class Patch:
    """Changes applied to a fork.

    ``tool_results`` maps a call id (of a step up to the fork point) to the result to
    record for it: it replaces a recorded result in place, or records one for a call that
    has none. ``tool_errors`` lists the call ids whose patched result is an error.
    ``append_user`` is a user message sent after any pending calls. ``instructions``
    replaces the agent's instructions for the fork.
    """

    tool_results: Mapping[str, Any] = field(default_factory=dict)
    tool_errors: Sequence[str] = ()
    append_user: str | None = None
    instructions: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool_results": dict(self.tool_results),
            "tool_errors": list(self.tool_errors),
            "append_user": self.append_user,
            "instructions": self.instructions,
        }


def _create_fork_run(store: Store, run: RunInfo, explicit: bool) -> str:
    """Create the fork's row under an id nobody else holds: the create is the claim (insert
    if absent), so two forks made at once never share an id."""
    if explicit:
        if not store.create_run(run):
            raise Conflict(
                f"run {run.run_id!r} already exists; pick another id for the fork",
                code="history.fork_exists",
            )
        return run.run_id
    stem = run.run_id[:180]
    n = 1
    while True:
        candidate = f"{stem}.fork-{n}"
        try:
            if store.get_run(candidate) is None and store.create_run(
                replace(run, run_id=candidate)
            ):
                return candidate
        except RunIdSpent:
            pass  # a deleted fork's name is spent: the next one
        n += 1


def _copying(source: str) -> dict[str, Any]:
    return {
        "code": "history.fork_incomplete",
        "message": f"this fork of {source!r} is being copied; if it stays so, the process "
        "copying it stopped half-way: delete it and fork again",
        "retryable": False,
    }


def user_record(text: str, earlier: Record | None) -> dict[str, Any]:
    """The ``user:<n>`` record that sends ``text`` after step n: after the messages an
    earlier fork already appended there (a fork of a fork at the same step), not instead."""
    if earlier is None:
        return {"kind": "user", "text": text}
    body = dict(earlier.body)
    body["then"] = [*(body.get("then") or ()), text]
    return body


def _copy_into_fork(
    journal: Journal,
    new_run_id: str,
    run_id: str,
    from_step: int,
    origin: str,
    patch: Patch,
    kept: Sequence[Record],
    calls: Mapping[str, Any],
    fence: str,
    place: Mapping[str, str] | None,
    subruns: Sequence[tree_forks.SubRun],
) -> None:
    # Written first, and ``fork:done`` last: drivers refuse a fork with one and not the
    # other instead of running from a partial journal.
    journal.write(
        new_run_id,
        names.FORK,
        {
            "kind": "fork",
            "source": run_id,
            "origin": origin,
            "step": from_step,
            "patch": patch.to_json(),
        },
        fence=fence,
    )
    appended_at = names.user(from_step)
    for rec in kept:
        if rec.name == names.HEADER:
            continue
        body = dict(rec.body)
        if rec.name.startswith(names.TOOL) and rec.name[len(names.TOOL) :] in patch.tool_results:
            continue  # written below, patched
        if rec.name == appended_at and patch.append_user:
            continue  # written below, with the patch's message after it
        if rec.name == names.RUN_START:
            body["incarnation"] = names.new_incarnation()  # a fork is a start of its own
            # Its place in a tree is its own: a fork of a sub-run is top-level (it must not
            # hand its source's parent over), a sub-run's fork is its forked parent's.
            body.pop("parent", None)
            body.pop("root", None)
            body.update(place or {})
        journal.write(new_run_id, rec.name, body, fence=fence)
    for call_id, result in patch.tool_results.items():
        journal.write(
            new_run_id,
            names.tool(call_id),
            names.tool_body(
                call_id,
                calls[call_id].name,
                result,
                is_error=call_id in patch.tool_errors,
                patched=True,
            ),
            fence=fence,
        )
    if patch.append_user:
        earlier = next((r for r in kept if r.name == appended_at), None)
        journal.write(new_run_id, appended_at, user_record(patch.append_user, earlier), fence=fence)
    for sub in subruns:
        journal.write(
            new_run_id,
            names.child(sub.call_id),
            tree_forks.child_record(sub, new_run_id),
            fence=fence,
        )


def fork(
    run_id: str,
    from_step: int,
    patch: Patch | None = None,
    new_run_id: str | None = None,
    *,
    by: Any = "",
    store: Store | None = None,
) -> str:
    """Create a fork of ``run_id`` at ``from_step`` and return its id (not yet driven:
    ``resume`` it, or hand it to a worker). ``by`` (a user object, a username or an
    ``identity.Actor``) must hold ``fork_run``; without it the fork is logged as "system"."""
    actor = identity.resolve(by) if by else None
    if actor is not None:
        identity.require(actor, identity.FORK_RUN, "fork a run")
    store = store or runtime.store()
    patch = patch or Patch()
    if new_run_id is not None:
        validate_run_id(new_run_id)
    new_run_id, subruns = fork_run(store, run_id, from_step, patch, new_run_id)
    payload: dict[str, Any] = {"step": from_step, "patch": patch.to_json()}
    if subruns:
        payload["sub_runs"] = subruns
    store.log_action(
        identity.logged(actor, "fork", run_id, new_run_id, payload)
        if actor is not None
        else ActionInfo("system", "fork", run_id, new_run_id, payload, channel=identity.PYTHON)
    )
    return new_run_id


def _check_patch(patch: Patch, calls: Mapping[str, Any], run_id: str, from_step: int) -> None:
    """Refuse a patch that names calls outside the kept steps, or that is malformed."""
    unknown = sorted(set(patch.tool_results) - set(calls))
    if unknown:
        raise ConfigError(
            f"patch names calls {unknown} that are not in steps 1-{from_step} of run "
            f"{run_id!r}; known calls: {sorted(calls) or 'none'}",
            code="history.patch",
        )
    stray = sorted(set(patch.tool_errors) - set(patch.tool_results))
    if stray:
        raise ConfigError(
            f"patch marks calls {stray} as errors without giving them a result; put them in "
            "tool_results too",
            code="history.patch",
        )
    if patch.append_user is not None and not isinstance(patch.append_user, str):
        raise ConfigError("append_user must be a string", code="history.patch")
    encode(patch.to_json())  # a patch that does not encode fails before anything is written


def _make_fork_row(
    store: Store,
    source: Any,
    start: Record,
    run_id: str,
    new_run_id: str | None,
    from_step: int,
    kept_state: RunState,
    place: Mapping[str, str] | None,
) -> str:
    """Create the fork's row, refusing to be driven until ``fork:done``; return its id."""
    # The row is created refusing to be driven (failed, not retryable: recovery leaves it
    # alone) and the copy is written under the fork's lease (a driver handed the id finds it
    # busy; a cancel waits). Only ``fork:done`` makes it runnable, in the same write. A fork
    # whose maker died half-way stays failed, saying so, instead of being driven from an
    # empty or partial journal as a fresh run.
    return _create_fork_run(
        store,
        lifecycle.created(
            FAILED,
            run_id=new_run_id or run_id,
            agent=source.agent,
            last_error=_copying(run_id),
            input=start.get("input"),
            session_id=None,
            forked_from=run_id,
            forked_step=from_step,
            fingerprint=start.get("fingerprint"),
            usage=kept_state.usage().to_json(),
            spend=kept_state.spend().to_json(),
            turns=from_step,
            parent_run_id=(place or {}).get("parent"),
            root_run_id=(place or {}).get("root"),
        ),
        explicit=new_run_id is not None,
    )


def _refuse_if_pruned(store: Store, run_id: str, new_run_id: str) -> None:
    """Delete the fork's row and refuse when its source was pruned after it was read."""
    if not store.run_held(run_id):
        # Its source was pruned after it was read: the fork would reference sub-runs that
        # are gone. ``prune`` sees a fork row committed before it deletes, so this is the
        # other order; nothing is copied yet.
        store.delete_run(new_run_id)
        raise NotFound(
            f"run {run_id!r} was pruned while it was being forked; nothing was forked",
            code="run.not_found",
        )


def _fork_subruns(
    store: Store,
    subruns: Sequence[tree_forks.SubRun],
    new_run_id: str,
    place: Mapping[str, str] | None,
) -> None:
    """Fork the sub-runs the fork gets of its own, before it is runnable."""
    # The sub-runs the fork gets of its own, before it is runnable (a fork driven before its
    # child exists would start that child afresh, doing its recorded steps again). Each
    # waits for its parent to drive it (``awaiting_input``: recovery leaves it alone), so
    # one whose maker died before the parent was done is never driven on its own.
    root = (place or {}).get("root") or new_run_id
    for sub in subruns:
        if sub.fork:
            fork_run(
                store,
                sub.source,
                None,
                Patch(),
                child_run_id(new_run_id, sub.call_id),
                {"parent": new_run_id, "root": root},
            )


def _fill_fork(
    store: Store,
    journal: Journal,
    new_run_id: str,
    run_id: str,
    from_step: int,
    origin: str,
    patch: Patch,
    kept: Sequence[Record],
    calls: Mapping[str, Any],
    place: Mapping[str, str] | None,
    subruns: Sequence[tree_forks.SubRun],
    unknown: list[str],
) -> list[Any]:
    """Copy the journal into the fork under its lease and make it runnable (or halted);
    return the halts it saved."""
    try:
        lease = HeldLease(store, new_run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        raise ConfigError(
            f"fork {new_run_id!r} was taken by another process before its journal was "
            "written; it is left failed: fork again",
            code="history.fork_busy",
        ) from None
    try:
        if journal.records(new_run_id):
            # Someone took the fork before its maker held it: a cancel (the only writer
            # that does not refuse an uncopied fork). It stays as they left it.
            raise ConfigError(
                f"fork {new_run_id!r} was cancelled before its journal was copied; nothing "
                "was copied: fork again",
                code="history.fork_cancelled",
            )
        _copy_into_fork(
            journal,
            new_run_id,
            run_id,
            from_step,
            origin,
            patch,
            kept,
            calls,
            lease.token,
            place,
            subruns,
        )
        halted = []
        if unknown:
            # The halt rows before the status: a fork halted on nothing a person can see
            # would never move.
            for halt in unknown_outcomes(RunState.of(journal.records(new_run_id)), new_run_id):
                if store.save_halt(halt, fence=lease.token):
                    halted.append(halt)
        lifecycle.record_in(
            journal,
            new_run_id,
            names.FORK_DONE,
            {"kind": "fork-done"},
            lifecycle.PERSON,
            fence=lease.token,
            to=HALTED if unknown else (AWAITING_INPUT if place else QUEUED),
        )
    finally:
        lease.release()
    return halted


def fork_run(
    store: Store,
    run_id: str,
    from_step: int | None,
    patch: Patch,
    new_run_id: str | None,
    place: Mapping[str, str] | None = None,
) -> tuple[str, dict[str, str]]:
    """Make the fork (``from_step`` None: at the source's latest step) and return its id and
    the sub-runs it references or forked, by call id (``tree_forks``). ``place``: the parent
    and root of a sub-run's fork, made by its forked parent."""
    journal = Journal(store)
    source = store.get_run(run_id)
    if source is None:
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    # A fork would carry the import's records (its decisions among them) into a run driven
    # here: only a live import, whose decisions were verified, may be forked.
    refuse_inert(source, "fork it")
    records = journal.records(run_id)
    state = RunState.of(records)
    if from_step is None:
        from_step = len(state.turns)
    check_step(run_id, from_step, len(state.turns))
    kept = prefix(records, from_step)
    kept_state = RunState.of(kept)
    calls = {c.id: c for turn in kept_state.turns for c in kept_state.calls(turn)}
    _check_patch(patch, calls, run_id, from_step)
    if source.kind != KIND_AGENT:
        raise ConfigError(
            f"run {run_id!r} is a {source.kind} journal, not an agent run; fork the session "
            "or the turn instead",
            code="history.not_an_agent_run",
        )
    start = state.start
    if start is None:
        raise ConfigError(f"run {run_id!r} has not started", code="history.not_started")
    # Calls whose outcome is unknown up to the fork point, and that the patch leaves so.
    unknown = sorted(set(kept_state.live_attempts()) - set(patch.tool_results))
    subruns = tree_forks.plan(
        store, records, calls, set(kept_state.results) | set(patch.tool_results), source.imported
    )
    fork_record = state.fork
    origin = (fork_record.get("origin") or fork_record.get("source")) if fork_record else run_id
    new_run_id = _make_fork_row(
        store, source, start, run_id, new_run_id, from_step, kept_state, place
    )
    failpoints.hit("after-fork-row")
    _refuse_if_pruned(store, run_id, new_run_id)
    _fork_subruns(store, subruns, new_run_id, place)
    halted = _fill_fork(
        store,
        journal,
        new_run_id,
        run_id,
        from_step,
        origin,
        patch,
        kept,
        calls,
        place,
        subruns,
        unknown,
    )
    announce_halts(store, source.agent, halted)
    return new_run_id, {
        sub.call_id: str(tree_forks.child_record(sub, new_run_id)["run_id"]) for sub in subruns
    }


def fork_session(session: Any, from_turn: int, new_session_id: str | None = None) -> str:
    """A new session whose transcript is ``session``'s first ``from_turn`` answered turns."""
    store = session.store
    journal = Journal(store)
    refuse_inert(store.get_run(session.journal_id), "fork the session")
    answers = SessionLog.of(session._records()).closed  # the caller's own session only
    if (
        isinstance(from_turn, bool)
        or not isinstance(from_turn, int)
        or not (0 <= from_turn <= len(answers))
    ):
        raise ConfigError(
            f"session {session.session_id!r} has turns 0-{len(answers)}, not {from_turn!r}",
            code="history.step",
        )

    def fork_named(session_id: str) -> Any:
        return type(session)(
            session.agent, session_id, store=session._store, channel=session.channel
        )

    if new_session_id is None:
        n = 0
        while True:
            n += 1
            fork_session_obj = fork_named(f"{session.session_id[:110]}-fork-{n}")
            try:
                if fork_session_obj._ensure_journal():  # opened here: two forks never share
                    break
            except (RunIdSpent, ConfigError):
                pass  # taken, or a deleted fork's name (spent): the next one
        new_session_id = fork_session_obj.session_id
    else:
        names.validate_session_id(new_session_id)
        fork_session_obj = fork_named(new_session_id)
        if store.get_run(fork_session_obj.journal_id) is not None:
            raise Conflict(f"session {new_session_id!r} already exists", code="history.fork_exists")
        fork_session_obj._ensure_journal()
    for turn in answers[:from_turn]:
        journal.write(fork_session_obj.journal_id, turn.record.name, dict(turn.record.body))
    journal.write(
        fork_session_obj.journal_id,
        names.SESSION_FORK,
        {"kind": "fork", "source": session.session_id, "turn": from_turn},
    )
    return new_session_id
