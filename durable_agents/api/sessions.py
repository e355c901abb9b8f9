"""Sessions: send a message (a new turn for a worker), deliver one once (webhooks), read
the transcript. Views call the engine's ``Session``; they never edit state."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Status

from ..conf import get_settings
from ..database import reads
from ..engine.commands.sessions import Session
from ..engine.errors import ApprovalPending
from ..engine.views import API_CHANNEL, validate_session_id
from ..models import ApprovalRequest, Run
from .approvals import approval_rows, approvals_out
from .auth import check, require
from .errors import ApiError
from .runs import _agent
from .schemas import (
    ERRORS,
    MessageIn,
    SendOnceOut,
    SessionOut,
    SubmitOut,
    TurnOut,
)

router = Router(tags=["sessions"])


def _session(session_id: str, agent_name: str | None) -> Session:
    """The session as the API's channel sees it: one the API opened (or a new one); a
    session of another agent or channel is refused by the engine (409, 403)."""
    validate_session_id(session_id)
    recorded = reads.session_agent(session_id)
    name = agent_name or recorded
    if not name:
        raise ApiError(
            400,
            "session.agent_missing",
            f"session {session_id!r} is new: say which agent it talks to ({{'agent': ...}})",
        )
    return Session(_agent(name), session_id, channel=API_CHANNEL)


def _awaiting(exc: ApprovalPending) -> ApiError:
    return ApiError(
        409,
        "session.awaiting_approval",
        str(exc),
        run_id=exc.run_id,
        calls=list(exc.details.get("calls") or ()),
    )


@router.post("/sessions/{session_id}/messages", response={202: SubmitOut, **ERRORS})
def send_message(request: HttpRequest, session_id: str, payload: MessageIn) -> Status[SubmitOut]:
    """A new turn for ``text``, handed to a driver (needs ``add_run``). While a turn is
    open, only its own message is accepted (409 ``session.turn_open``, or
    ``session.awaiting_approval`` naming the call to decide first)."""
    by = require(request, "start")
    session = _session(session_id, payload.agent)
    try:
        with transaction.atomic(using=get_settings().database):
            run_id = session.submit(payload.text, by=by)
    except ApprovalPending as exc:
        raise _awaiting(exc) from None
    return Status(202, SubmitOut(session_id=session_id, run_id=run_id))


@router.put(
    "/sessions/{session_id}/messages/{key}",
    response={200: SendOnceOut, 202: SendOnceOut, **ERRORS},
)
def send_once(
    request: HttpRequest, session_id: str, key: str, payload: MessageIn
) -> Status[SendOnceOut]:
    """Deliver ``text`` under the delivery ``key``, once (needs ``add_run``): 202 when its
    turn was queued (or waits on a person), 200 with the answer when it was answered, 409
    ``session.key_conflict`` when the key was first delivered with another message."""
    by = require(request, "start")
    session = _session(session_id, payload.agent)
    with transaction.atomic(using=get_settings().database):
        # Every delivery is logged, redeliveries too: each one may hand the turn over again.
        sent = session.send_once(key, payload.text, by=by)
    out = SendOnceOut(
        session_id=session_id,
        key=key,
        run_id=sent.run_id,
        status=sent.status,
        answer=sent.answer,
    )
    return Status(200 if sent.status == "answered" else 202, out)


@router.get("/sessions/{session_id}", response={200: SessionOut, **ERRORS})
def read_session(request: HttpRequest, session_id: str) -> SessionOut:
    """The transcript, the open turn (if any) and the tool calls awaiting a decision
    (needs ``view_run``)."""
    check(request, "view_runs")
    validate_session_id(session_id)
    session = reads.session(session_id)
    if session is None:
        raise ApiError(404, "session.not_found", f"no session {session_id!r}")
    log = session.log
    open_turns = [s.run_id for s in log.waiting()]
    runs = {r.run_id: r for r in Run.objects.filter(run_id__in=open_turns)}
    pending = ApprovalRequest.objects.filter(run_id__in=open_turns, status="pending")
    return SessionOut(
        session_id=session_id,
        agent=session.agent,
        # As the model reads it: a turn that did not finish says so (not "None").
        transcript=[{"role": m.role, "content": m.content} for m in log.history()],
        open_turns=[
            TurnOut(run_id=run_id, status=runs[run_id].status if run_id in runs else "queued")
            for run_id in open_turns
        ],
        approvals=approvals_out(list(approval_rows(pending.order_by("created_at", "id")))),
    )
