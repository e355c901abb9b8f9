"""Request and response bodies, and the input rules applied before any view runs.

Request bodies refuse unknown fields. Text and JSON values refuse NUL characters and lone
surrogates, which PostgreSQL cannot store: such a request fails validation (422
``request.invalid``) instead of failing in the database.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from django.db.models import Q, QuerySet
from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field, StrictBool

from ..engine.views import validate_run_id
from .errors import ApiError

MAX_LIMIT = 500
MAX_OFFSET = 1_000_000_000


def _clean_text(value: str, where: str = "text") -> str:
    if "\x00" in value:
        raise ValueError(f"{where} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where} must not contain lone surrogates") from None
    return value


def _clean_json(value: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise ValueError("JSON value is nested too deeply (more than 64 levels)")
    if isinstance(value, str):
        _clean_text(value, "JSON strings")
    elif isinstance(value, list):
        for item in value:
            _clean_json(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            _clean_text(str(key), "JSON keys")
            _clean_json(item, depth + 1)
    return value


Text = Annotated[str, AfterValidator(_clean_text)]
JsonValue = Annotated[Any, AfterValidator(_clean_json)]
Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_clean_text)]
Note = Annotated[str, Field(max_length=10_000), AfterValidator(_clean_text)]

RunStatus = Literal[
    "queued",
    "running",
    "awaiting_approval",
    "awaiting_input",
    "sleeping",
    "throttled",
    "halted",
    "compensating",
    "finished",
    "compensated",
    "failed",
    "cancelled",
]
ApprovalStatus = Literal["pending", "approved", "denied", "withdrawn", "expired", "all"]
HaltStatus = Literal["open", "resolved", "orphaned", "all"]

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="page size")]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET, description="rows to skip")]
After = Annotated[int, Field(ge=0, le=2**63 - 1, description="only records with a larger seq")]
RecordLimit = Annotated[int, Field(ge=1, le=10_000, description="at most this many records")]


def checked_run_id(run_id: str) -> str:
    """A run id from the path: any id the engine may have made (``ConfigError``
    ``config.run_id``, 400, otherwise)."""
    return validate_run_id(run_id, derived=True)


def checked_call_id(call_id: str) -> str:
    if not 0 < len(call_id) <= 400 or not call_id.isprintable():
        raise ApiError(
            400,
            "config.call_id",
            f"invalid call id {call_id[:100]!r}: a tool call id is 1-400 printable characters",
        )
    return call_id


class Body(Schema):
    model_config = ConfigDict(extra="forbid")


# -- errors ---------------------------------------------------------------------------


class ErrorOut(Schema):
    code: str = Field(description="stable error code, e.g. run.not_found")
    message: str = Field(description="what happened and how to fix it")
    details: dict[str, Any] | None = Field(
        None, description="extra facts (e.g. the standing decision)"
    )
    detail: list[Any] | None = Field(None, description="request.invalid: each invalid field")


ERRORS: dict[int, type[Schema]] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    422: ErrorOut,
}


Cursor = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1000,
        description="the next_cursor of the previous page: the page after it (keyset; "
        "offset must be 0)",
    ),
]


@dataclass(frozen=True)
class Page:
    count: int | None
    items: list[Any]
    next_cursor: str | None


def page(
    rows: QuerySet[Any],
    limit: int,
    offset: int,
    *,
    cursor: str | None = None,
    count: bool = True,
    name: str,
) -> Page:
    """One page of ``rows``, which are ordered newest first by (``created_at``, primary
    key), with the cursor of the page after it; and the total, unless ``count`` is false
    or the page is a cursor's. A cursor page reads its rows through the list's index from
    where the previous page stopped, so page 10,000 costs what page 1 does; an ``OFFSET``
    reads and drops every row before it, and ``COUNT(*)`` reads every row it counts. One
    query for the page, one for the count when there is one, whatever the page size.
    ``name`` ties a cursor to its list: another list's cursor is refused."""
    if cursor is not None:
        if offset:
            raise ApiError(400, "request.cursor", "give a cursor or an offset, not both")
        keyed_by_text = rows.model._meta.pk.get_internal_type() == "CharField"
        at, pk = _decode_cursor(cursor, name, str if keyed_by_text else int)
        # The first condition is the one the index range reads (the row comparison below
        # it, spelled for every database, only filters that range).
        rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk), created_at__lte=at)
    total = rows.count() if count and cursor is None else None
    items = list(rows[offset : offset + limit + 1])
    more = len(items) > limit
    items = items[:limit]
    after = _encode_cursor(name, items[-1]) if more else None
    return Page(total, items, after)


def _encode_cursor(name: str, row: Any) -> str:
    text = json.dumps([name, row.created_at.isoformat(), row.pk], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, name: str, key: type) -> tuple[datetime, Any]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, at, pk = json.loads(text)
        when = datetime.fromisoformat(at)
        if kind != name or when.tzinfo is None or type(pk) is not key:
            raise ValueError(kind)
        if isinstance(pk, str):
            pk = _clean_text(pk, "cursor")
        elif not 0 <= int(str(pk)) < 2**63:  # a bigint, or the database refuses the comparison
            raise ValueError(pk)
    except (ValueError, TypeError, binascii.Error):
        raise ApiError(
            400, "request.cursor", f"not a cursor of this list ({name}): pass next_cursor as is"
        ) from None
    return when, pk


# -- runs -----------------------------------------------------------------------------


class StartIn(Body):
    agent: Name = Field(description="the agent's name, as registered")
    input: JsonValue = Field(description="the run's input (any JSON but null)")
    run_id: str | None = Field(
        None,
        description="your id for the run (1-200 of A-Za-z0-9_.:-); generated if omitted. "
        "Starting the same id with the same input again is a no-op that hands it over again",
        # Documented, not enforced here: the engine checks run ids, so a bad one answers
        # 400 ``config.run_id`` with the rule, as the Python API does.
        json_schema_extra={"pattern": r"^[A-Za-z0-9_.:\-]{1,200}$"},
    )


class Accepted(Schema):
    run_id: str


class CancelIn(Body):
    reason: Note = ""
    # "Cancel and compensate": undo the run's completed compensable calls (a saga's abort).
    compensate: bool = False


class CancelOut(Schema):
    run_id: str
    status: str


class RunOut(Schema):
    run_id: str
    agent: str
    status: str
    turns: int
    attempts: int
    last_error: dict[str, Any] | None
    session_id: str | None
    parent_run_id: str | None
    root_run_id: str | None
    forked_from: str | None
    forked_step: int | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None


class RunPage(Schema):
    count: int | None = Field(
        description="rows in the list; null on a cursor's page or with count=false"
    )
    limit: int
    offset: int
    next_cursor: str | None = Field(
        description="pass as cursor for the page after this one; null on the last page"
    )
    items: list[RunOut]


class DecisionOut(Schema):
    approver: str = Field(description="whose decision it is (counted once for them)")
    approved: bool
    note: str
    signed: bool
    created_at: datetime | None
    arguments: dict[str, Any] | None = Field(
        None, description="an edited approval: the arguments it approved running instead"
    )
    deputy: str = Field(
        "",
        description="who made the decision for ``approver`` (a delegation); empty: the "
        "approver themselves",
    )


class Progress(Schema):
    need: int = Field(description="approvals needed")
    approved_by: list[str]
    denied_by: list[str]
    eligible: list[str] | None = Field(
        description="quorum: who may decide; null for a 1-of-1 gate (anyone holding "
        "approve_toolcall)"
    )
    pending: list[str] | None = Field(description="quorum: eligible approvers yet to decide")
    deputies: dict[str, str] = Field(
        default_factory=dict,
        description="approvers yet to decide whose deputy may decide for them now (a "
        "delegation in force covering the call): approver -> deputy",
    )


class MovedOut(Schema):
    from_rule: str | None = Field(description="the rule the call was under before the edit")
    arguments: Any = Field(
        description="the edited arguments: the call's approvals are for these, not ``arguments``"
    )


class RuleOut(Schema):
    name: str = Field(description="the approval rule that asked (``default``: none matched)")
    explain: str | None = Field(
        description='the values that decided it, as journaled: "amount_cents 125000 > 100000"'
    )
    need: int = Field(description="approvals needed")
    groups: list[str] = Field(
        description="whose members decide: the rule's group, then the one an escalation added; "
        "empty: anyone holding approve_toolcall"
    )
    requester: str | None = Field(description="who started the run, when a person did")
    requester_may_decide: bool = Field(
        description="false: the requester may not decide the call (separation of duties)"
    )
    moved_by_edit: MovedOut | None = Field(
        description="an approver's edit moved the call under this (stricter) rule"
    )
    text: str = Field(
        description='for people: "rule lead: amount_cents 50000 <= 100000 → 1 of support-leads"'
    )


class DeadlineOut(Schema):
    remind_at: datetime | None
    escalate_at: datetime | None
    escalate_to: str | None = Field(description="the group an escalation adds as approvers")
    expire_at: datetime | None
    on_expiry: str | None = Field(description='"deny", "cancel" or "halt"; null: no expiry')
    escalated_to: str | None = Field(description="set once the call escalated")
    next_step: str | None = Field(
        description='"remind", "escalate" or "expire": the next step not taken yet; null: none'
    )
    next_at: datetime | None = Field(description="when the next step falls due")
    text: str = Field(
        description="for people, against the database's clock when the response was made: "
        '"escalates to oncall in 3 h · expires in 2 d 21 h, then denied"'
    )


class ApprovalOut(Schema):
    run_id: str
    call_id: str
    tool_name: str
    arguments: Any
    previous_arguments: Any = Field(
        None,
        description="set when the call was approved with other arguments than it would now "
        "run with, or for a tool its MCP server has changed since (then equal to "
        "``arguments``): it is asked again, and only ``arguments`` will run",
    )
    tool_digest: str = Field(
        "",
        description="for an MCP server's tool, the digest of its definition (schema, "
        "description, annotations) the call is asked about; a decision is for that "
        "definition only. Empty for a Python tool",
    )
    policy: dict[str, Any]
    status: str
    created_at: datetime | None
    decided_at: datetime | None
    due_at: datetime | None = Field(
        None,
        description="when its deadline's next step (remind, escalate, expire) falls due, by "
        "the database's clock; null when it has none left (docs/approvals.md, Deadlines)",
    )
    progress: Progress
    decisions: list[DecisionOut]
    incarnation: str | None = Field(
        description="the nonce of the run start that asked (signed decisions bind it); null "
        "when the run was deleted or started again since"
    )
    arguments_sha256: str = Field(
        description="hex SHA-256 of the arguments' canonical JSON, as signed decisions bind it"
    )
    rule: RuleOut | None = Field(
        None, description="the approval rule that asked and why; null: a one-rule gate"
    )
    deadline: DeadlineOut | None = Field(
        None, description="the call's deadline steps and where it stands; null: none"
    )


class ApprovalPage(Schema):
    count: int | None = Field(
        description="rows in the list; null on a cursor's page or with count=false"
    )
    limit: int
    offset: int
    next_cursor: str | None = Field(
        description="pass as cursor for the page after this one; null on the last page"
    )
    items: list[ApprovalOut]


class HaltOut(Schema):
    run_id: str
    call_id: str = Field(description="the halted tool call (or step name)")
    tool_name: str
    arguments: Any
    attempt: str = Field(
        description="the journal name of the attempt whose outcome is unknown (cause "
        '"expired": of the expiry, approval:<call>)'
    )
    attempted_at: datetime | None
    cause: str = Field(
        description='"crashed", "contended", "outcome_unknown", or "expired" (its approval '
        "request expired and its deadline halts the run: nothing ran)"
    )
    reason: dict[str, Any] | None = Field(
        description='with cause "outcome_unknown": what the tool raised, {"type", "message"}; '
        'with "expired": {"type": "expired", "message"}'
    )
    status: str
    resolution: dict[str, Any] | None
    resolved_by: str | None
    created_at: datetime | None
    resolved_at: datetime | None


class HaltPage(Schema):
    count: int | None = Field(
        description="rows in the list; null on a cursor's page or with count=false"
    )
    limit: int
    offset: int
    next_cursor: str | None = Field(
        description="pass as cursor for the page after this one; null on the last page"
    )
    items: list[HaltOut]


class RunDetail(RunOut):
    input: Any
    answer: str | None
    usage: dict[str, Any]
    spend: dict[str, Any]
    approvals: list[ApprovalOut] = Field(description="tool calls awaiting a decision")
    halts: list[HaltOut] = Field(description="open halts")


class RecordOut(Schema):
    seq: int
    name: str
    kind: str
    data: Any = Field(description="the record's JSON, decoded")
    created_at: datetime | None


class JournalOut(Schema):
    run_id: str
    records: list[RecordOut]


# -- approvals ------------------------------------------------------------------------


_EDIT = (
    "approvals only: the arguments to run instead of the ones asked about, validated "
    "against the tool's schema (400 approval.edit_invalid; also for a tool with "
    "editable=False); a quorum's approvals must agree (409 approval.arguments_disagree)"
)


_FOR = (
    "decide as the deputy of this approver (a delegation in force): the decision is "
    "theirs, made by you. Omitted: your own decision, or, if you may not decide the call "
    "yourself, for the one approver you are the deputy of who may"
)


class DecideIn(Body):
    approved: StrictBool
    for_approver: Name | None = Field(None, description=_FOR)
    note: Note = Field("", description="a denial's note is the message the model reads")
    edit: dict[Text, JsonValue] | None = Field(None, description=_EDIT)
    arguments: dict[Text, JsonValue] | None = Field(
        None,
        description="the call's arguments as the decider was shown them (the approvals "
        "list's `arguments`): if the call asks about others by now (a deploy asked again "
        "meanwhile), 409 approval.arguments_changed and nothing is recorded; omitted, the "
        "decision is for the arguments the call asks about when it arrives",
    )


class SignedDecisionIn(Body):
    approver: Name = Field(description="the approver's username, whose key signed")
    approved: StrictBool
    note: Note = Field("", description="signed too: exactly the note the approver signed")
    signature: str = Field(
        min_length=1,
        max_length=1000,
        description="base64 Ed25519 signature over the format-2 decision bytes "
        "(durable_agents.decision_bytes; docs/api.md shows them byte by byte)",
    )
    edit: dict[Text, JsonValue] | None = Field(
        None, description=_EDIT + "; signed too (decision_bytes(edited=...))"
    )
    for_approver: Name | None = Field(
        None,
        description="the approver whose deputy ``approver`` is, deciding for them; signed too "
        "(decision_bytes(for_approver_id=...)). Omitted: the approver's own decision",
    )


class DecisionResult(Schema):
    run_id: str
    call_id: str
    status: str = Field(description="approved, denied, or pending (a quorum still counting)")
    tally: dict[str, Any]


# -- delegations ----------------------------------------------------------------------

DelegationState = Literal["current", "in_force", "upcoming", "ended", "revoked", "all"]


class DelegationIn(Body):
    approver: Name | None = Field(
        None,
        description="who is away; omitted: you. For someone else it takes the "
        "delegate_approvals permission",
    )
    deputy: Name = Field(description="who decides for them (holds approve_toolcall)")
    starts_at: datetime | None = Field(
        None, description="timezone-aware; omitted or in the past: now"
    )
    ends_at: datetime = Field(description="timezone-aware, after the start")
    groups: list[Name] = Field(
        default_factory=list, description="only calls asked of these groups; empty: any"
    )
    tools: list[Name] = Field(default_factory=list, description="only these tools; empty: any")
    note: Note = ""


class RevokeDelegationIn(Body):
    note: Note = ""


class DelegationOut(Schema):
    id: int
    approver: str
    deputy: str
    starts_at: datetime
    ends_at: datetime
    groups: list[str]
    tools: list[str]
    note: str
    state: str = Field(description="upcoming, in_force, ended or revoked (the database's clock)")
    created_by: str
    created_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str


class DelegationPage(Schema):
    count: int | None
    limit: int
    offset: int
    next_cursor: str | None = None
    items: list[DelegationOut]


# -- halts ----------------------------------------------------------------------------


class ResolveIn(Body):
    result: JsonValue = Field(description="what the call really returned (any JSON)")
    is_error: StrictBool = False
    evidence: JsonValue = Field(None, description="how you know (a provider id, a log line)")
    min_age: float | None = Field(
        None,
        ge=0,
        le=10**9,
        allow_inf_nan=False,
        description="refuse (409 halt.too_young) unless the attempt is at least this many "
        "seconds old; the HALT_MIN_AGE setting applies in any case",
    )


class ResolveOut(Schema):
    run_id: str
    call_id: str
    seq: int
    result: Any
    is_error: bool
    evidence: Any
    by: str


# -- sessions ---------------------------------------------------------------------------


class MessageIn(Body):
    text: Annotated[str, Field(min_length=1, max_length=100_000), AfterValidator(_clean_text)]
    agent: Name | None = Field(None, description="the agent a new session talks to")


class SubmitOut(Schema):
    session_id: str
    run_id: str


class SendOnceOut(Schema):
    session_id: str
    key: str
    run_id: str
    status: str = Field(description="queued, answered or paused")
    answer: str | None = None


class TurnOut(Schema):
    run_id: str
    status: str


class SessionOut(Schema):
    session_id: str
    agent: str
    transcript: list[dict[str, str]]
    open_turns: list[TurnOut]
    approvals: list[ApprovalOut]


# -- history ----------------------------------------------------------------------------


class HistoryOut(Schema):
    run_id: str
    steps: list[dict[str, Any]]


class ForkIn(Body):
    from_step: int = Field(ge=0, le=100_000)
    tool_results: dict[Text, JsonValue] | None = None
    tool_errors: list[Text] | None = None
    append_user: (
        Annotated[str, Field(min_length=1, max_length=100_000), AfterValidator(_clean_text)] | None
    ) = None
    instructions: Annotated[str, Field(max_length=100_000), AfterValidator(_clean_text)] | None = (
        None
    )
    new_run_id: Name | None = None


class ComparisonOut(Schema):
    a: list[dict[str, Any]]
    b: list[dict[str, Any]]
    diverged_at: int | None
    drift: dict[str, Any]


# -- waits ------------------------------------------------------------------------------


class WaitOut(Schema):
    kind: str = Field(
        description="interrupt (a question), signal, timer, channel, or throttle (a limit: "
        "name is its key, prompt the limit, deadline the retry time)"
    )
    name: str = Field(description="the wait's name, unique in its run (channel: the channel)")
    call_id: str = Field(description="the tool call that waits")
    tool: str
    prompt: str = Field(description="interrupt: the question, as the tool asked it")
    answer_schema: Any = Field(
        None, description="interrupt: the JSON schema an answer must fit (null: any JSON)"
    )
    deadline: datetime | None = Field(
        None, description="timer: its wake time; signal: its timeout's deadline"
    )
    signal_delivered: bool = Field(
        False, description="signal: delivered already (the run consumes it when driven)"
    )


class KeptSignalOut(Schema):
    name: str
    payload: Any
    at: datetime | None
    by: str | None


class ChannelMessageOut(Schema):
    channel: str
    key: str
    payload: Any
    enqueued_at: datetime | None
    by: str | None = Field(description="who enqueued it (null: a system, from Python)")
    acked_by: str | None = Field(
        description="the tool call that received and acked it (null: not received yet)"
    )


class WaitsOut(Schema):
    run_id: str
    status: str
    waits: list[WaitOut] = Field(description="what the run waits for, nothing resolved yet")
    signals: list[KeptSignalOut] = Field(
        description="signals delivered that no wait consumed yet (kept for when it waits)"
    )
    messages: list[ChannelMessageOut] = Field(
        description="the run's channel messages in enqueue order, received (acked) or not"
    )


class AnswerIn(Body):
    value: JsonValue = Field(
        description="the answer, checked against the question's schema (400 "
        "interrupt.invalid_answer, nothing recorded)"
    )
    prompt: str | None = Field(
        None,
        description="the question as its answerer was shown it (the wait's prompt): if the "
        "run asks another question under that name by now, 409 interrupt.question_changed "
        "and nothing is recorded. Left out, the answer is for the question asked now",
    )


class SignalIn(Body):
    payload: JsonValue = Field(None, description="any JSON; the first payload wins")


class EnqueueIn(Body):
    key: str = Field(
        description="the message's key on the channel (A-Za-z0-9_.-, 1-100): a redelivery "
        "under the same key changes nothing"
    )
    payload: JsonValue = Field(None, description="any JSON; the first payload wins")


class EnqueueResult(Schema):
    run_id: str
    channel: str
    key: str
    value: Any = Field(description="the standing payload (the first one)")
    recorded: bool = Field(description="false: a message with this key was already there")
    woke: bool = Field(description="the run was handed to a driver")


class WaitResult(Schema):
    run_id: str
    name: str
    value: Any = Field(description="the standing answer or payload (the first one)")
    recorded: bool = Field(description="false: the same value was already there")
    woke: bool = Field(description="the run was handed to a driver")


class WakeOut(Schema):
    run_id: str
    name: str
    wake_at: datetime = Field(description="the timer's journaled wake time (unchanged)")
    woke_at: datetime = Field(description="when it woke")
    early: bool = Field(description="woken before its time, by a person")
    by: str | None = Field(description="who woke it early")
    recorded: bool = Field(description="false: the timer had already woken")
    woke: bool = Field(description="the run was handed to a driver")
