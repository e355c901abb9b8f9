"""Fork and compare in the admin: "what if the tool had said something else?"

* **Fork from here** (``<run>/fork/?step=N``): a form for the patch (replacement tool
  results, errors, an appended user message, instructions, the fork's id). Submitting calls
  ``durable_agents.fork`` and hands the fork to a driver.
* **Compare** (``compare/?a=<run>&b=<run>``): both runs' steps side by side, the first step
  where they differ, and the drift summary from ``durable_agents.compare``.
* The run page's **lineage**: the run it was forked from, its forks, its session.

Glue only: nothing here writes a journal record or a status by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from ..celery.dispatch import enqueue
from ..conf import get_settings
from ..engine.commands.forks import Patch, fork
from ..engine.errors import DurableAgentsError
from ..engine.steps import Step, ToolStep, compare, history
from ..models import Run
from .base import (
    AnyModelAdmin,
    admin_actor,
    admin_url,
    json_field,
    object_gone,
    page,
    require,
    run_url,
)
from .pretty import pretty

_TEXTAREA = {"rows": 3, "cols": 60, "class": "da-mono"}


def compare_url(admin: AnyModelAdmin, a: str, b: str) -> str:
    return admin_url(admin, "compare") + "?" + urlencode({"a": a, "b": b})


# -- the run page's lineage ---------------------------------------------------------------


def lineage(admin: AnyModelAdmin, run: Any) -> dict[str, Any]:
    """The run's source, its forks (one query) and its session, for the run page."""
    source = None
    if run.forked_from:
        source = {
            "run_id": run.forked_from,
            "step": run.forked_step,
            "url": run_url(admin, run.forked_from),
            "compare_url": compare_url(admin, run.forked_from, run.run_id),
        }
    rows = Run.objects.filter(forked_from=run.run_id).order_by("created_at", "run_id")
    forks = [
        {
            "run_id": f["run_id"],
            "step": f["forked_step"],
            "status": f["status"],
            "created_at": f["created_at"],
            "url": run_url(admin, f["run_id"]),
            "compare_url": compare_url(admin, run.run_id, f["run_id"]),
        }
        for f in rows.values("run_id", "forked_step", "status", "created_at")
    ]
    session = admin_url(admin, "session", quote(run.session_id)) if run.session_id else None
    return {"source": source, "forks": forks, "session_url": session}


# -- fork from here -----------------------------------------------------------------------


class ForkForm(forms.Form):
    """The patch for a fork at one step; ``clean()`` leaves it in ``cleaned_data["patch"]``.

    One result field and one error checkbox per tool call of the steps up to the fork point.
    A blank result keeps the recorded one; ticking *error* without a result re-records the
    recorded result as an error."""

    append_user = forms.CharField(
        required=False,
        max_length=20000,
        label="Append a user message",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Sent after the step (and after any call left without a result).",
    )
    instructions = forms.CharField(
        required=False,
        max_length=50000,
        label="Replace the instructions",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
        help_text="For the fork only; blank keeps the agent's instructions.",
    )
    new_run_id = forms.CharField(
        required=False,
        max_length=200,
        label="Fork's run id",
        help_text="Optional: 1-200 characters of A-Za-z0-9_.:- (default: <run>.fork-<n>).",
    )

    def __init__(self, calls: Sequence[ToolStep], data: Any = None) -> None:
        super().__init__(data)
        self.calls = list(calls)
        for i, call in enumerate(self.calls):
            self.fields[f"result_{i}"] = forms.CharField(
                required=False,
                label=f"Replacement result of {call.call_id}",
                widget=forms.Textarea(attrs=_TEXTAREA),
                help_text="JSON; blank keeps the recorded result.",
            )
            self.fields[f"error_{i}"] = forms.BooleanField(
                required=False, label="mark as error", help_text="The model reads it as an error."
            )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        results: dict[str, Any] = {}
        errors: list[str] = []
        for i, call in enumerate(self.calls):
            text = str(data.get(f"result_{i}") or "").strip()
            as_error = bool(data.get(f"error_{i}"))
            if text:
                try:
                    results[call.call_id] = json_field(text, f"The result of {call.call_id}")
                except forms.ValidationError as exc:
                    self.add_error(f"result_{i}", exc)
                    continue
            elif as_error and call.has_result:
                results[call.call_id] = call.result
            elif as_error:
                self.add_error(
                    f"error_{i}",
                    f"Call {call.call_id} has no recorded result; give the result to record "
                    "as an error.",
                )
                continue
            if as_error:
                errors.append(call.call_id)
        data["patch"] = Patch(
            tool_results=results,
            tool_errors=errors,
            append_user=str(data.get("append_user") or "").strip() or None,
            instructions=str(data.get("instructions") or "").strip() or None,
        )
        data["new_run_id"] = str(data.get("new_run_id") or "").strip() or None
        return data


def _step_arg(request: HttpRequest, count: int) -> int | None:
    try:
        step = int(request.GET.get("step", ""))
    except ValueError:
        return None
    return step if 0 <= step <= count else None


def _call_rows(steps: Sequence[Step], form: ForkForm) -> list[dict[str, Any]]:
    """The steps up to the fork point, each call with its recorded result and its fields."""
    out, i = [], 0
    for s in steps:
        calls = []
        for call in s.tool_calls:
            calls.append(
                {
                    "call": call,
                    "arguments": pretty(call.arguments),
                    "recorded": pretty(call.result) if call.has_result else None,
                    "result_field": form[f"result_{i}"],
                    "error_field": form[f"error_{i}"],
                }
            )
            i += 1
        out.append({"step": s, "calls": calls})
    return out


def fork_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: the form for a fork at ``?step=N``. POST: fork, hand the fork to a driver, and
    go to its page. Both need ``fork_run``; a refusal by the engine writes nothing."""
    require(request, "fork")
    run = admin.get_object(request, unquote(object_id))
    if run is None:
        return object_gone(admin, request, object_id)
    try:
        steps = history(run.run_id)
    except DurableAgentsError as exc:
        messages.error(request, f"Cannot fork run {run.run_id}: {exc} [{exc.code}]")
        return HttpResponseRedirect(run_url(admin, run.run_id))
    step = _step_arg(request, len(steps))
    if step is None:
        messages.error(
            request,
            f"Run {run.run_id} has no step {request.GET.get('step')!r}; its steps are "
            f"0-{len(steps)} (0 is the input). Use a Fork from here link on the run page.",
        )
        return HttpResponseRedirect(run_url(admin, run.run_id))
    kept = steps[:step]
    form = ForkForm(
        [c for s in kept for c in s.tool_calls], request.POST if request.method == "POST" else None
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            # One transaction: a refused or interrupted fork leaves no half-copied run for
            # recovery to pick up; the driver starts after commit.
            with transaction.atomic(using=get_settings().database):
                fork_id = fork(
                    run.run_id,
                    step,
                    data["patch"],
                    new_run_id=data["new_run_id"],
                    by=admin_actor(request),
                )
                enqueue(fork_id)
        except DurableAgentsError as exc:
            form.add_error(None, f"Nothing was written: {exc} [{exc.code}]")
        else:
            messages.success(
                request,
                f"Forked run {run.run_id} at step {step} as {fork_id}; the fork was handed to a "
                "driver.",
            )
            return HttpResponseRedirect(run_url(admin, fork_id))
    return page(
        admin,
        request,
        "admin/durable_agents/run/fork.html",
        f"Fork {run.run_id} from step {step}",
        {
            "original": run,
            "run_url": run_url(admin, run.run_id),
            "step": step,
            "current": kept[-1] if kept else None,
            "rows": _call_rows(kept, form),
            "form": form,
            "action_url": admin_url(admin, "fork", quote(run.run_id)) + f"?step={step}",
        },
    )


# -- compare ------------------------------------------------------------------------------


def _step_cells(step: Step | None) -> dict[str, Any] | None:
    if step is None:
        return None
    calls = [
        {
            "id": t.call_id,
            "name": t.name,
            "arguments": pretty(t.arguments),
            "result": pretty(t.result) if t.has_result else None,
            "is_error": t.is_error,
        }
        for t in step.tool_calls
    ]
    return {"text": step.text, "finish": step.finish, "calls": calls}


def compare_view(admin: AnyModelAdmin, request: HttpRequest) -> HttpResponse:
    """Two runs' steps side by side; an unknown run id is said so (404), not a crash."""
    if not admin.has_view_permission(request):
        raise PermissionDenied
    a, b = (str(request.GET.get(k) or "").strip() for k in ("a", "b"))
    context: dict[str, Any] = {"a": a, "b": b, "form_url": admin_url(admin, "compare")}
    title = f"Compare {a} with {b}" if a and b else "Compare two runs"

    def refuse(error: str, status: int) -> HttpResponse:
        template = "admin/durable_agents/run/compare.html"
        return page(admin, request, template, title, {**context, "error": error}, status)

    if not (a and b):
        return refuse("Give two run ids." if (a or b) else "", 400 if (a or b) else 200)
    found = set(Run.objects.filter(run_id__in=[a, b]).values_list("run_id", flat=True))
    missing = [x for x in (a, b) if x not in found]
    if missing:
        names = " and ".join(repr(x) for x in missing)
        return refuse(f"No run {names}: check the id on the Runs list.", 404)
    try:
        result = compare(a, b)
    except DurableAgentsError as exc:
        return refuse(f"Cannot compare: {exc} [{exc.code}]", 400)
    rows = []
    for i in range(max(len(result.a), len(result.b))):
        sa = result.a[i] if i < len(result.a) else None
        sb = result.b[i] if i < len(result.b) else None
        same = sa is not None and sb is not None and sa.shape() == sb.shape()
        rows.append(
            {
                "n": i + 1,
                "a": _step_cells(sa),
                "b": _step_cells(sb),
                "differs": not same,
                "diverged": result.diverged_at == i + 1,
            }
        )
    drift = result.drift
    context.update(
        {
            "a_url": run_url(admin, a),
            "b_url": run_url(admin, b),
            "rows": rows,
            "diverged_at": result.diverged_at,
            "tool_order": drift["tool_order"],
            "tool_order_changed": drift["tool_order_changed"],
            "arguments": [
                {**d, "a": pretty(d["a"]), "b": pretty(d["b"])} for d in drift["arguments"]
            ],
            "step_count": drift["step_count"],
            "finish": drift["finish"],
        }
    )
    return page(admin, request, "admin/durable_agents/run/compare.html", title, context)
