"""History, fork and compare: "what if the tool had said something else?"

* ``history(run_id)`` — a run's steps, one per model turn (its text, its tool calls with
  their results, approvals), read from the journal alone; ``as_of(run_id, step)`` — the
  transcript as it stood after that step.
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
  maker died is never driven from its input or from a partial journal.
* ``compare(a, b)`` — each run's steps, the first step where they differ (call ids aside),
  and the drift: tool order, arguments, step count, finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import failpoints, identity, runtime
from .approvals import new_incarnation
from .errors import ConfigError, RunBusy
from .journal import Journal
from .leases import HeldLease
from .loop import unknown_outcomes
from .model import Message
from .ports import FAILED, HALTED, KIND_AGENT, QUEUED, ActionInfo, RunInfo, Store
from .records import Record, encode, validate_run_id
from .transcript import RunState


@dataclass(frozen=True)
class ToolStep:
    call_id: str
    name: str
    arguments: Any
    result: Any = None
    is_error: bool = False
    has_result: bool = False
    reconciled: bool = False
    approval: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Step:
    step: int
    text: str
    tool_calls: tuple[ToolStep, ...]
    usage: Mapping[str, int]
    finish: str
    at: str | None

    def shape(self) -> tuple[Any, ...]:
        """What the step did, call ids aside: for comparing trajectories."""
        return (
            self.text,
            tuple(
                (t.name, encode(t.arguments), encode(t.result), t.is_error) for t in self.tool_calls
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "text": self.text,
            "tool_calls": [t.__dict__ for t in self.tool_calls],
            "usage": dict(self.usage),
            "finish": self.finish,
            "at": self.at,
        }


def _args(raw: str) -> Any:
    try:
        from .records import decode

        return decode(raw or "{}")
    except Exception:
        return raw


def steps_of(records: Sequence[Record]) -> list[Step]:
    state = RunState.of(records)
    by_name = {r.name: r for r in records}
    steps = []
    for n, turn in enumerate(state.turns, start=1):
        message = state.assistant(turn)
        calls = []
        for call in message.tool_calls:
            rec = state.results.get(call.id)
            approval = by_name.get(f"approval:{call.id}")
            calls.append(
                ToolStep(
                    call_id=call.id,
                    name=call.name,
                    arguments=_args(call.arguments),
                    result=rec.get("result") if rec else None,
                    is_error=bool(rec.get("is_error")) if rec else False,
                    has_result=rec is not None,
                    reconciled=bool(rec.get("reconciled")) if rec else False,
                    approval=dict(approval.body) if approval else None,
                )
            )
        steps.append(
            Step(
                step=n,
                text=message.content,
                tool_calls=tuple(calls),
                usage=dict(turn.get("usage") or {}),
                finish=str(turn.get("finish") or ""),
                at=turn.created_at.isoformat() if turn.created_at else None,
            )
        )
    return steps


def history(run_id: str, *, store: Store | None = None) -> list[Step]:
    """The steps of a run, in order, from its journal (no model or tool is called)."""
    store = store or runtime.store()
    return steps_of(Journal(store).history(run_id))


def as_of(run_id: str, step: int, *, store: Store | None = None) -> list[Message]:
    """The transcript as it stood after ``step`` (0: just the input)."""
    store = store or runtime.store()
    records = Journal(store).history(run_id)
    state = RunState.of(records)
    _check_step(run_id, step, len(state.turns))
    return RunState.of(_prefix(records, step)).messages()


def _check_step(run_id: str, step: Any, count: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= count:
        raise ConfigError(
            f"run {run_id!r} has no step {step!r}; its steps are 0-{count} (0 is the input)",
            code="history.step",
        )


def _prefix(records: Sequence[Record], step: int) -> list[Record]:
    """The records a run held right after ``step``: its turns up to it, their results, the
    attempts of their calls (a claim with no result is an outcome nobody knows) and the user
    messages sent after them."""
    state = RunState.of(records)
    keep_calls = {c.id for turn in state.turns[:step] for c in state.calls(turn)}
    out = []
    for rec in records:
        name = rec.name
        kind, _, rest = name.partition(":")
        if (
            name in ("@journal", "run:start")
            or (kind == "model" and int(rest) <= step)
            or (kind == "user" and int(rest) <= step)
            or (kind == "tool" and rest in keep_calls)
            or (kind in ("attempt", "not-started") and rest.rpartition(":")[0] in keep_calls)
            or (name.startswith("@spend/") and int(name.split("/")[1]) <= step)
        ):
            out.append(rec)
    return out


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
            raise ConfigError(
                f"run {run.run_id!r} already exists; pick another id for the fork",
                code="history.fork_exists",
            )
        return run.run_id
    stem = run.run_id[:180]
    n = 1
    while True:
        candidate = f"{stem}.fork-{n}"
        if store.get_run(candidate) is None and store.create_run(replace(run, run_id=candidate)):
            return candidate
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
) -> None:
    # Written first, and ``fork:done`` last: drivers refuse a fork with one and not the
    # other instead of running from a partial journal.
    journal.write(
        new_run_id,
        "fork",
        {
            "kind": "fork",
            "source": run_id,
            "origin": origin,
            "step": from_step,
            "patch": patch.to_json(),
        },
        fence=fence,
    )
    appended_at = f"user:{from_step}"
    for rec in kept:
        if rec.name == "@journal":
            continue
        body = dict(rec.body)
        if rec.name.startswith("tool:") and rec.name[5:] in patch.tool_results:
            continue  # written below, patched
        if rec.name == appended_at and patch.append_user:
            continue  # written below, with the patch's message after it
        if rec.name == "run:start":
            body["incarnation"] = new_incarnation()  # a fork is a start of its own
        journal.write(new_run_id, rec.name, body, fence=fence)
    for call_id, result in patch.tool_results.items():
        journal.write(
            new_run_id,
            f"tool:{call_id}",
            {
                "kind": "tool",
                "call_id": call_id,
                "name": calls[call_id].name,
                "result": result,
                "is_error": call_id in patch.tool_errors,
                "read_only": False,
                "reconciled": False,
                "patched": True,
            },
            fence=fence,
        )
    if patch.append_user:
        earlier = next((r for r in kept if r.name == appended_at), None)
        journal.write(new_run_id, appended_at, user_record(patch.append_user, earlier), fence=fence)


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
    journal = Journal(store)
    source = store.get_run(run_id)
    if source is None:
        raise ConfigError(f"no run {run_id!r}", code="run.not_found")
    records = journal.history(run_id)
    state = RunState.of(records)
    _check_step(run_id, from_step, len(state.turns))
    kept = _prefix(records, from_step)
    kept_state = RunState.of(kept)
    calls = {c.id: c for turn in kept_state.turns for c in kept_state.calls(turn)}
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
    if new_run_id is not None:
        validate_run_id(new_run_id)
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
    fork_record = state.fork
    origin = (fork_record.get("origin") or fork_record.get("source")) if fork_record else run_id
    # The row is created refusing to be driven (failed, not retryable: recovery leaves it
    # alone) and the copy is written under the fork's lease (a driver handed the id finds it
    # busy; a cancel waits). Only ``fork:done`` makes it runnable, in the same write. A fork
    # whose maker died half-way stays failed, saying so, instead of being driven from an
    # empty or partial journal as a fresh run.
    new_run_id = _create_fork_run(
        store,
        RunInfo(
            run_id=new_run_id or run_id,
            agent=source.agent,
            status=FAILED,
            last_error=_copying(run_id),
            input=start.get("input"),
            session_id=None,
            forked_from=run_id,
            forked_step=from_step,
            fingerprint=start.get("fingerprint"),
            usage=kept_state.usage().to_json(),
            spend=kept_state.spend().to_json(),
            turns=from_step,
        ),
        explicit=new_run_id is not None,
    )
    failpoints.hit("after-fork-row")
    try:
        lease = HeldLease(store, new_run_id, runtime.lease_ttl()).acquire()
    except RunBusy:
        raise ConfigError(
            f"fork {new_run_id!r} was taken by another process before its journal was "
            "written; it is left failed: fork again",
            code="history.fork_busy",
        ) from None
    try:
        if journal.history(new_run_id):
            # Someone took the fork before its maker held it: a cancel (the only writer
            # that does not refuse an uncopied fork). It stays as they left it.
            raise ConfigError(
                f"fork {new_run_id!r} was cancelled before its journal was copied; nothing "
                "was copied: fork again",
                code="history.fork_cancelled",
            )
        _copy_into_fork(
            journal, new_run_id, run_id, from_step, origin, patch, kept, calls, lease.token
        )
        if unknown:
            # The halt rows before the status: a fork halted on nothing a person can see
            # would never move.
            for halt in unknown_outcomes(RunState.of(journal.history(new_run_id)), new_run_id):
                store.save_halt(halt)
        journal.write(
            new_run_id,
            "fork:done",
            {"kind": "fork-done"},
            fence=lease.token,
            run_changes={
                "status": HALTED if unknown else QUEUED,
                "last_error": None,
                "attempts": 0,
            },
        )
    finally:
        lease.release()
    payload = {"step": from_step, "patch": patch.to_json()}
    store.log_action(
        identity.logged(actor, "fork", run_id, new_run_id, payload)
        if actor is not None
        else ActionInfo("system", "fork", run_id, new_run_id, payload, channel=identity.PYTHON)
    )
    return new_run_id


@dataclass(frozen=True)
class Comparison:
    a: list[Step]
    b: list[Step]
    diverged_at: int | None
    drift: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": [s.to_json() for s in self.a],
            "b": [s.to_json() for s in self.b],
            "diverged_at": self.diverged_at,
            "drift": self.drift,
        }


def compare(a: str, b: str, *, store: Store | None = None) -> Comparison:
    """Where two runs' trajectories part, call ids aside."""
    store = store or runtime.store()
    for run_id in (a, b):
        if store.get_run(run_id) is None:
            raise ConfigError(f"no run {run_id!r}", code="run.not_found")
    journal = Journal(store)
    ra, rb = journal.history(a), journal.history(b)
    sa, sb = steps_of(ra), steps_of(rb)
    diverged = None
    for i in range(max(len(sa), len(sb))):
        if i >= len(sa) or i >= len(sb) or sa[i].shape() != sb[i].shape():
            diverged = i + 1
            break
    fa, fb = RunState.of(ra).complete, RunState.of(rb).complete
    drift: dict[str, Any] = {
        "tool_order": [
            [t.name for s in sa for t in s.tool_calls],
            [t.name for s in sb for t in s.tool_calls],
        ],
        "arguments": [
            {"step": x.step, "tool": tx.name, "a": tx.arguments, "b": ty.arguments}
            for x, y in zip(sa, sb, strict=False)
            for tx, ty in zip(x.tool_calls, y.tool_calls, strict=False)
            if tx.name == ty.name and encode(tx.arguments) != encode(ty.arguments)
        ],
        "step_count": [len(sa), len(sb)],
        "finish": [
            fa.get("answer") if fa else None,
            fb.get("answer") if fb else None,
        ],
    }
    drift["tool_order_changed"] = drift["tool_order"][0] != drift["tool_order"][1]
    return Comparison(sa, sb, diverged, drift)


def fork_session(session: Any, from_turn: int, new_session_id: str | None = None) -> str:
    """A new session whose transcript is ``session``'s first ``from_turn`` answered turns."""
    from .sessions import validate_session_id

    store = session.store
    journal = Journal(store)
    answers = [r for r in journal.history(session.journal_id) if r.name.startswith("answer:")]
    if (
        isinstance(from_turn, bool)
        or not isinstance(from_turn, int)
        or not (0 <= from_turn <= len(answers))
    ):
        raise ConfigError(
            f"session {session.session_id!r} has turns 0-{len(answers)}, not {from_turn!r}",
            code="history.step",
        )
    if new_session_id is None:
        n = 1
        while store.get_run(f"{session.session_id[:110]}-fork-{n}>session") is not None:
            n += 1
        new_session_id = f"{session.session_id[:110]}-fork-{n}"
    validate_session_id(new_session_id)
    fork_session_obj = type(session)(session.agent, new_session_id, store=session._store)
    if store.get_run(fork_session_obj.journal_id) is not None:
        raise ConfigError(f"session {new_session_id!r} already exists", code="history.fork_exists")
    fork_session_obj._ensure_journal()
    for rec in answers[:from_turn]:
        journal.write(fork_session_obj.journal_id, rec.name, dict(rec.body))
    journal.write(
        fork_session_obj.journal_id,
        "fork",
        {"kind": "fork", "source": session.session_id, "turn": from_turn},
    )
    return new_session_id
