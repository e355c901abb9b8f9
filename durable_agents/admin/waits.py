"""Runs waiting on the world, in the admin: the "awaiting input" queue (questions with a form
generated from their schema, awaited signals, channels waited on), sleeping runs with their
wake time and a "Wake now" button, and the same on the run page (with the signals delivered
early and the run's channel messages, received or not).

Glue only: answering calls ``answer_interrupt`` and waking calls ``wake_timer``; both check
the permission again, journal once (the first value wins), write the action log and hand
the run to a driver after commit. A bad answer is a form error and records nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import hints
from ..celery.dispatch import deferred
from ..database.reads import asking_live, wait_records
from ..engine.commands.timers import wake_timer
from ..engine.commands.waits import answer_interrupt
from ..engine.errors import DurableAgentsError, InterruptAnswerInvalid
from ..engine.ports import AWAITING_INPUT, SLEEPING
from ..engine.views import Record
from ..engine.waits import (
    CHANNEL,
    INTERRUPT,
    SIGNAL,
    TIMER,
    OpenWait,
    inbox,
    kept_signals,
    open_waits,
)
from ..models import Run
from .answerform import AnswerForm
from .base import (
    BY_RECOVERY,
    AnyModelAdmin,
    admin_actor,
    admin_url,
    allows,
    not_handed_over,
    page,
    require,
    run_url,
)
from .paging import counted
from .pretty import pretty

QUEUE_SIZE = 200  # runs shown on the queue page (oldest first: they waited longest)


def question_slug(run_id: str, name: str) -> str:
    """A short id for one question's form fields, unique on a page of many runs."""
    return hashlib.sha256(f"{run_id}\0{name}".encode()).hexdigest()[:10]


def prompt_digest(prompt: str) -> str:
    """What an answer form posts back of the question it showed (``shown_prompt_sha256``):
    an answer is for that question, refused if the run asks another one by now."""
    return hashlib.sha256(prompt.encode()).hexdigest()


def _answer_urls(admin: AnyModelAdmin, run_id: str, name: str) -> str:
    return admin_url(admin, "answer", quote(run_id), name)


def waits_of_run(
    admin: AnyModelAdmin,
    request: HttpRequest,
    run: Any,
    records: Iterable[Record],
    forms: dict[str, AnswerForm] | None = None,
) -> dict[str, Any]:
    """What ``run`` waits for, ready for a template: questions (with their form, when the
    user may answer), awaited signals, channels waited on, timers (with "Wake now", when the
    user may wake), signals delivered that no wait consumed yet, and the channel messages
    (each with the call that acked it, or none yet)."""
    records = list(records)
    may_answer = allows(request, "answer")
    may_wake = allows(request, "wake")
    open_ = open_waits(records)
    questions, signals, channels, timers = [], [], [], []
    for wait in open_:
        item: dict[str, Any] = {"wait": wait, "run": run}
        if wait.kind == INTERRUPT:
            form = (forms or {}).get(wait.name) or AnswerForm(
                wait.schema, auto_id=f"da-{question_slug(run.run_id, wait.name)}-%s"
            )
            item.update(
                form=form if may_answer else None,
                shown=prompt_digest(wait.prompt),
                url=_answer_urls(admin, run.run_id, wait.name),
                schema=pretty(wait.schema) if wait.schema is not None else None,
            )
            questions.append(item)
        elif wait.kind == SIGNAL:
            signals.append(item)
        elif wait.kind == CHANNEL:
            item["command"] = hints.command(
                "send",
                run.run_id,
                wait.name,
                by=request.user.get_username(),
                placeholders=(hints.KEY, "--payload", hints.JSON),
            )
            channels.append(item)
        elif wait.kind == TIMER:
            item["wake_url"] = (
                admin_url(admin, "wake", quote(run.run_id), wait.name) if may_wake else None
            )
            timers.append(item)
    kept = [
        {
            "signal": s,
            "payload": pretty(s.payload),
            "at": datetime.fromtimestamp(s.at_ms / 1000, tz=UTC) if s.at_ms else None,
        }
        for s in kept_signals(records)
    ]
    inbox_ = [{"message": m, "payload": pretty(m.payload)} for m in inbox(records)]
    return {
        "questions": questions,
        "signals": signals,
        "channels": channels,
        "timers": timers,
        "kept_signals": kept,
        "messages": inbox_,
        "may_answer": may_answer,
        "any": bool(questions or signals or channels or timers),
    }


# -- the queue -----------------------------------------------------------------------------


def _may_see(request: HttpRequest) -> None:
    """Who may read runs, or answer their questions (as the approval queue is seen by those
    who may decide), sees the queue and the questions' pages."""
    if not (allows(request, "view_runs") or allows(request, "answer")):
        raise PermissionDenied


def waiting_view(admin: AnyModelAdmin, request: HttpRequest) -> TemplateResponse:
    """Runs awaiting input (questions, signals, channels), running runs whose MCP call asks
    staff (elicitation), and sleeping runs, oldest first. Three
    queries whatever the number of runs: the count (up to ``paging.CAP``), the runs, their
    wait records."""
    _may_see(request)
    rows = Run.objects.filter(Q(status__in=[AWAITING_INPUT, SLEEPING]) | asking_live()).order_by(
        "updated_at"
    )
    total, capped = counted(rows)
    runs = list(rows.only("run_id", "agent", "status", "updated_at")[:QUEUE_SIZE])
    records = wait_records([r.run_id for r in runs])
    items = []
    for run in runs:
        waits = waits_of_run(admin, request, run, records[run.run_id])
        items.append({"run": run, "url": run_url(admin, run.run_id), **waits})
    return page(
        admin,
        request,
        "admin/durable_agents/run/waiting.html",
        "Waiting on the world",
        {
            "awaiting": [i for i in items if i["questions"] or i["signals"] or i["channels"]],
            "sleeping": [i for i in items if i["timers"]],
            "total": total,
            "capped": capped,
            "shown": len(runs),
            "may_answer": allows(request, "answer"),
        },
    )


# -- answering -----------------------------------------------------------------------------


def _back(admin: AnyModelAdmin, request: HttpRequest, run_id: str) -> str:
    """Where a form came from: the run page (``back=run``), the inbox or the queue."""
    if request.POST.get("back") == "run":
        return run_url(admin, run_id)
    if request.POST.get("back") == "inbox":
        return reverse("admin:durable_agents_inbox", current_app=admin.admin_site.name)
    return admin_url(admin, "waiting")


def _question(run_id: str, name: str) -> OpenWait | None:
    for wait in open_waits(wait_records([run_id])[run_id]):
        if wait.kind == INTERRUPT and wait.name == name:
            return wait
    return None


def answer_page(
    admin: AnyModelAdmin,
    request: HttpRequest,
    run: Any,
    wait: OpenWait,
    form: AnswerForm,
    status: int = 200,
) -> TemplateResponse:
    return page(
        admin,
        request,
        "admin/durable_agents/run/answer.html",
        f"Answer {wait.name!r} of run {run.run_id}",
        {
            "original": run,
            "run_url": run_url(admin, run.run_id),
            "queue_url": admin_url(admin, "waiting"),
            "q": {
                "wait": wait,
                "form": form if allows(request, "answer") else None,
                "shown": prompt_digest(wait.prompt),
                "url": _answer_urls(admin, run.run_id, wait.name),
                "schema": pretty(wait.schema) if wait.schema is not None else None,
            },
        },
        status=status,
    )


def answer_view(
    admin: AnyModelAdmin, request: HttpRequest, object_id: str, name: str
) -> HttpResponse:
    """GET: the question's own page. POST: answer it (``approve_toolcall``); a bad answer is
    shown on the form and nothing is recorded."""
    _may_see(request)
    run = admin.get_object(request, unquote(object_id))
    if run is None:
        messages.warning(request, f"Run {unquote(object_id)!r} does not exist any more.")
        return HttpResponseRedirect(admin_url(admin, "waiting"))
    wait = _question(run.run_id, name)
    if wait is None:
        messages.info(request, f"Run {run.run_id} has no open question {name!r}.")
        return HttpResponseRedirect(run_url(admin, run.run_id))
    if request.method != "POST":
        return answer_page(admin, request, run, wait, AnswerForm(wait.schema))
    require(request, "answer")
    form = AnswerForm(wait.schema, request.POST)
    if not form.is_valid():
        return answer_page(admin, request, run, wait, form)
    back = _back(admin, request, run.run_id)
    shown = request.POST.get("shown_prompt_sha256")
    if shown and shown != prompt_digest(wait.prompt):
        # The tool ran again and asks another question under this name: the answer was
        # for the one the page showed. Nothing is recorded; the new question is shown.
        form.add_error(
            None,
            f"The run asks another question by now: {wait.prompt!r}. Nothing was recorded; "
            "read it and answer again. [interrupt.question_changed]",
        )
        return answer_page(admin, request, run, wait, form)
    try:
        with deferred() as late:
            outcome = answer_interrupt(
                run.run_id,
                name,
                form.value(),
                by=admin_actor(request),
                # The engine checks it against its own read too: a change after this one.
                prompt=wait.prompt if shown else None,
            )
    except InterruptAnswerInvalid as exc:  # bad input: a form error, nothing written
        problems = (getattr(exc, "details", None) or {}).get("problems") or [str(exc)]
        for problem in problems:
            form.add_error(None, str(problem))
        return answer_page(admin, request, run, wait, form)
    except DurableAgentsError as exc:
        messages.error(request, f"Nothing was recorded: {exc} [{exc.code}]")
        return HttpResponseRedirect(back)
    if late:  # the answer is journaled and the run queued; only the message failed
        not_handed_over(request, f"The answer to {name!r} is recorded", late[0].error, BY_RECOVERY)
        return HttpResponseRedirect(back)
    if outcome.recorded:
        messages.success(
            request,
            f"Answered {name!r} of run {run.run_id}; "
            + (
                "the run was handed to a driver."
                if outcome.woke or not wait.deadline
                else "the call waiting for it sends it to the MCP server."
            ),
        )
    else:
        messages.info(request, f"{name!r} was already answered the same way; nothing changed.")
    return HttpResponseRedirect(back)


# -- waking ------------------------------------------------------------------------------


def wake_view(
    admin: AnyModelAdmin, request: HttpRequest, object_id: str, name: str
) -> HttpResponse:
    """Wake a sleeping timer now (``cancel_run``): a staff decision, journaled and logged."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require(request, "wake")
    run_id = unquote(object_id)
    back = _back(admin, request, run_id)
    try:
        with deferred() as late:
            outcome = wake_timer(run_id, name, by=admin_actor(request))
    except DurableAgentsError as exc:
        messages.error(request, f"Not woken: {exc} [{exc.code}]")
        return HttpResponseRedirect(back)
    if late:  # woken (recorded) and the run queued; only the message failed
        not_handed_over(request, f"Timer {name!r} is woken (recorded)", late[0].error, BY_RECOVERY)
        return HttpResponseRedirect(back)
    if outcome.recorded:
        messages.success(
            request,
            f"Woke timer {name!r} of run {run_id} now (it was set for "
            f"{datetime.fromtimestamp(outcome.wake_ms / 1000, tz=UTC):%Y-%m-%d %H:%M:%S} UTC); "
            "the run was handed to a driver.",
        )
    else:
        messages.info(request, f"Timer {name!r} of run {run_id} had already woken.")
    return HttpResponseRedirect(back)
