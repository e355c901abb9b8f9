"""The notification outbox's rows: one per (request, fact, channel), written where the fact
is, repaired by a reconciling pass, tried again when staff ask. Delivering them is
``notifications.delivery``.

Writing. A fact of an approval request — it waits, was reminded, escalated, expired or
decided — becomes one ``Notification`` row per channel that wants it, unique on (request,
asked, event, channel): whoever writes it again (a retry, a second worker, the reconciling
pass) inserts nothing. The rows of a call that starts waiting are written in the
transaction that writes its request (``DjangoStore.save_approval_request``); the others by
receivers of the signals, in the process that wrote the fact, right after it committed.
Signals are at most once — a process that dies between the commit and the receiver loses
them — so each delivery pass first *reconciles*: it reads the requests the database shows
pending (the newest ``NOTIFY["BATCH"]``) and those decided or expired in the last
``NOTIFY["WINDOW"]`` seconds (the newest ``BATCH``; index ``da_approval_decided``), and
writes the rows missing for facts it can prove (a deadline step by its journal record,
``deadline:<call>:<step>``). Its cost depends on those bounds, not on the history.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, F, PositiveIntegerField, Q, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import ChannelConfig, Notify, get_settings
from ..engine import events, failpoints, identity, names
from ..engine.approvals import arguments_tag
from ..engine.identity import Actor
from ..engine.ports import (
    APPROVAL_APPROVED,
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_PENDING,
    IMPORTED_INERT,
)
from ..models import ApprovalRequest, JournalEntry, Notification
from .payloads import decided_details, render

log = logging.getLogger("durable_agents.notifications")

DELIVER_TASK = "durable_agents.tasks.deliver_notifications"
EVENT_OF_STEP = {
    "remind": events.APPROVAL_REMINDED,
    "escalate": events.APPROVAL_ESCALATED,
    "expire": events.APPROVAL_EXPIRED,
}


def asked_of(request: Any) -> str:
    """Which asking of the call a request row is: "" the first time, the arguments' tag
    when it is asked again about others (a new request, told again)."""
    if request.previous_arguments is None:
        return ""
    return arguments_tag(request.arguments, request.tool_digest)


def _wanting(notify: Notify, event: str) -> list[ChannelConfig]:
    return [c for c in notify.channels if event in c.events]


# -- writing rows ------------------------------------------------------------------------


def write(
    event: str,
    request: Any,
    *,
    agent: str,
    using: str,
    details: Mapping[str, Any] | None = None,
    at: Any = None,
    only: Iterable[str] | None = None,
    hand_over: bool = True,
) -> int:
    """Insert the rows of one fact (``event`` of the request row ``request``) for every
    channel that wants it (``only``: those named), unless they exist, and (``hand_over``)
    ask a worker for a delivery pass once they commit. Returns the rows offered; a row that
    existed is left as it was."""
    notify = get_settings().notify
    named = None if only is None else set(only)
    channels = [c for c in _wanting(notify, event) if named is None or c.name in named]
    if not channels:
        return 0
    asked = asked_of(request)
    rows = []
    for channel in channels:
        delivery_id = uuid.uuid4()
        payload = render(
            event,
            request,
            agent=agent,
            delivery_id=str(delivery_id),
            base_url=notify.base_url,
            channel=channel,
            details=details,
            at=at,
        )
        rows.append(
            Notification(
                delivery_id=delivery_id,
                request_id=request.pk,
                asked=asked,
                event=event,
                channel=channel.name,
                payload=payload,
            )
        )
    Notification.objects.using(using).bulk_create(rows, ignore_conflicts=True)
    if hand_over:
        kick(using)
    return len(rows)


def waiting(using: str, request_pk: int) -> None:
    """The store's hook, inside the transaction that writes the request ``request_pk`` (a
    call starts waiting, or is asked again): its rows commit with it. Never raises, and a
    failure here never undoes the request: the reconciling pass writes the rows then."""
    try:
        if not _wanting(get_settings().notify, events.APPROVAL_REQUESTED):
            return
        with transaction.atomic(using=using):  # a savepoint: only the rows roll back
            request = ApprovalRequest.objects.using(using).select_related("run").get(pk=request_pk)
            if request.run.imported == IMPORTED_INERT:
                return
            write(
                events.APPROVAL_REQUESTED,
                request,
                agent=request.run.agent,
                using=using,
                at=request.created_at,
            )
    except Exception:
        log.exception(
            "could not write the notifications of request %s; the next delivery pass will",
            request_pk,
        )


def _decoded(data: Any) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def on_fact(sender: Any, *, signal: Any, run_id: str, call_id: str, **details: Any) -> None:
    """Receiver of ``approval_decided`` and the deadline steps' signals: the fact's rows."""
    from ..signals import SIGNALS

    event = next(e for e, s in SIGNALS.items() if s is signal)
    settings = get_settings()
    if not _wanting(settings.notify, event):
        return
    # The fact is committed, its rows are not: a crash here is what reconcile() repairs.
    failpoints.hit(f"before-notify:{call_id}")
    using = settings.database
    request = (
        ApprovalRequest.objects.using(using)
        .select_related("run")
        .filter(run_id=run_id, call_id=call_id)
        .first()
    )
    if request is None or request.run.imported == IMPORTED_INERT:
        return
    at = request.decided_at if event in (events.APPROVAL_DECIDED, events.APPROVAL_EXPIRED) else None
    write(
        event,
        request,
        agent=details.get("agent") or request.run.agent,
        using=using,
        details=details,
        at=at,
    )


def connect() -> None:
    """Connect the receivers (``AppConfig.ready``); they do nothing without channels."""
    from .. import signals

    for signal in (
        signals.approval_decided,
        signals.approval_reminded,
        signals.approval_escalated,
        signals.approval_expired,
    ):
        signal.connect(on_fact, dispatch_uid="durable_agents.notifications")


# -- the reconciling pass ----------------------------------------------------------------


def reconcile(*, using: str | None = None) -> int:
    """Write the rows missing for facts the database shows (see the module's docstring for
    what it reads); returns how many rows it offered. Idempotent."""
    settings = get_settings()
    notify = settings.notify
    using = using or settings.database
    if not notify.channels:
        return 0
    now = timezone.now()
    rows = ApprovalRequest.objects.using(using).select_related("run")
    pending = list(
        rows.filter(status=APPROVAL_PENDING)
        .exclude(run__imported=IMPORTED_INERT)
        .order_by("-created_at")[: notify.batch]
    )
    finished = list(
        rows.filter(
            decided_at__gte=now - timedelta(seconds=notify.window),
            status__in=[APPROVAL_APPROVED, APPROVAL_DENIED, APPROVAL_EXPIRED],
        )
        .exclude(run__imported=IMPORTED_INERT)
        .order_by("-decided_at")[: notify.batch]
    )
    requests = {r.pk: r for r in [*pending, *finished]}
    if not requests:
        return 0
    have = set(
        Notification.objects.using(using)
        .filter(request_id__in=list(requests))
        .values_list("request_id", "asked", "event", "channel")
    )
    # (request, event, the journal record that proves or details it, channels missing)
    missing: list[tuple[Any, str, str | None, list[str]]] = []
    for request in requests.values():
        asked = asked_of(request)
        for event, record in _facts(request, now):
            lacking = [
                c.name
                for c in _wanting(notify, event)
                if (request.pk, asked, event, c.name) not in have
            ]
            if lacking:
                missing.append((request, event, record, lacking))
    if not missing:
        return 0
    wanted = {(r.run_id, name) for r, _, name, _ in missing if name}
    records = _records(using, wanted)
    offered = 0
    for request, event, name, lacking in missing:
        found = records.get((request.run_id, name)) if name else None
        if event in (events.APPROVAL_REMINDED, events.APPROVAL_ESCALATED) and found is None:
            continue  # the step has not happened (yet): its record is the only proof
        data, written_at = found if found is not None else (None, None)
        details, at = _details(request, event, data, written_at)
        offered += write(
            event,
            request,
            agent=request.run.agent,
            using=using,
            details=details,
            at=at,
            only=lacking,
            hand_over=False,  # the pass that reconciles sends them next
        )
    if offered:
        # Most often a signal lost with a process that died after its fact committed; now
        # and then a receiver this pass raced (its rows win, these are dropped).
        log.info("the reconciling pass offered %d missing notification row(s)", offered)
    return offered


def _details(request: Any, event: str, record: Any, written_at: Any) -> tuple[dict[str, Any], Any]:
    """A fact's details and time as its signal would have given them, from the request row
    and the journal record that proves the fact (None when there is none to read)."""
    record = record if isinstance(record, Mapping) else {}
    if event == events.APPROVAL_REQUESTED:
        return {}, request.created_at
    if event == events.APPROVAL_DECIDED:
        if record:
            return decided_details(record), request.decided_at
        return {"approved": request.status == APPROVAL_APPROVED}, request.decided_at
    step = next(s for s, e in EVENT_OF_STEP.items() if e == event)
    details = {k: record[k] for k in ("policy", "rule", "on_expiry", "escalated_to") if k in record}
    details["step"] = step
    at = written_at or (request.decided_at if event == events.APPROVAL_EXPIRED else None)
    return details, at


def _facts(request: Any, now: Any) -> list[tuple[str, str | None]]:
    """The facts a request row shows, each with the journal record that proves or details
    it: pending → waiting; approved or denied → decided (``approval:``); expired →
    expired (``deadline:…:expire``); and any remind or escalate step whose time had come
    while it was pending (proved only by its ``deadline:`` record)."""
    tag = asked_of(request) or None
    call = request.call_id
    facts: list[tuple[str, str | None]] = []
    if request.status == APPROVAL_PENDING:
        facts.append((events.APPROVAL_REQUESTED, None))
        until = now
    elif request.status == APPROVAL_EXPIRED:
        facts.append((events.APPROVAL_EXPIRED, names.deadline(call, "expire", tag)))
        until = request.decided_at
    else:
        facts.append((events.APPROVAL_DECIDED, names.decision(call, tag)))
        until = request.decided_at
    deadline = (request.policy or {}).get("deadline") or {}
    for step in ("remind", "escalate"):
        after = deadline.get(step)
        if (
            isinstance(after, int | float)
            and not isinstance(after, bool)
            and until is not None
            and request.created_at + timedelta(seconds=after) <= until
        ):
            facts.append((EVENT_OF_STEP[step], names.deadline(call, step, tag)))
    return facts


def _records(using: str, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[Any, Any]]:
    """The journal records ``wanted`` names, decoded, with when each was written: one
    query, by the journal's unique (run, name) index."""
    if not wanted:
        return {}
    found = (
        JournalEntry.objects.using(using)
        .filter(run_id__in={r for r, _ in wanted}, name__in={n for _, n in wanted})
        .values_list("run_id", "name", "data", "created_at")
    )
    return {
        (run_id, name): (_decoded(data), created_at)
        for run_id, name, data, created_at in found
        if (run_id, name) in wanted
    }


# -- handing a pass to a worker ------------------------------------------------------------


def kick(using: str) -> None:
    """Ask a worker for a delivery pass once this transaction commits (Celery dispatch
    only), so a notification leaves within seconds rather than at the next beat pass. A
    lost message costs at most one ``NOTIFY["INTERVAL"]``."""
    if get_settings().dispatch != "celery":
        return
    transaction.on_commit(_send_kick, using=using)


def _send_kick() -> None:
    from ..celery.site_app import task

    settings = get_settings()
    try:
        task(DELIVER_TASK).apply_async(
            queue=settings.celery_queue, expires=max(60.0, 6 * settings.notify.interval)
        )
    except Exception as exc:
        log.warning("could not ask a worker to deliver notifications now (%s); beat will", exc)


# -- staff: try again ----------------------------------------------------------------------


def retry(ids: Iterable[int], actor: Actor, *, using: str | None = None) -> int:
    """Send the notifications ``ids`` again at the next pass: a failed one from its first
    try on (a full round of backoff), a pending one now. Logged in the action history as
    ``retry_notifications``. Returns how many rows it changed."""
    from ..database.store import site_store

    using = using or get_settings().database
    ids = list(ids)
    rows = Notification.objects.using(using).filter(
        Q(status=Notification.FAILED) | Q(status=Notification.PENDING), pk__in=ids
    )
    changed = rows.update(
        attempts=Case(
            When(status=Notification.FAILED, then=Value(0)),
            default=F("attempts"),
            output_field=PositiveIntegerField(),
        ),
        status=Notification.PENDING,
        next_attempt_at=Now(),
    )
    if changed:
        site_store().log_action(
            identity.logged(
                actor, "retry_notifications", "", "", {"ids": sorted(ids)[:100], "count": changed}
            )
        )
        kick(using)
    return changed
