"""The admin's own pages and POST handlers: the run page, the approval decision, the halt
resolution, resume and cancel. The journal timeline is built in ``admin_timeline``; fork,
compare and sessions live in ``admin_history`` and ``admin_sessions``.

Glue only: every change goes through an engine command (``approve``, ``resolve_halt``,
``cancel``) or ``dispatch.enqueue``; nothing here sets a status. Each handler checks its own
permission, so a POST made without the button is refused the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .admin_timeline import agent_drift, build_timeline, pretty
from .dispatch import enqueue
from .engine.approvals import approve
from .engine.commands import cancel
from .engine.errors import DurableAgentsError
from .engine.halts import resolve_halt
from .engine.journal import Journal
from .engine.ports import APPROVAL_PENDING, HALT_OPEN, TERMINAL_STATUSES, ActionInfo
from .engine.records import Record
from .models import ActionLog
from .storage import DjangoStore

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

APPROVE_PERMISSION = "durable_agents.approve_toolcall"
RESOLVE_PERMISSION = "durable_agents.resolve_halt"
OPERATE_PERMISSION = "durable_agents.cancel_run"  # "operate runs": cancel and resume
FORK_PERMISSION = "durable_agents.fork_run"


def username(request: HttpRequest) -> str:
    return request.user.get_username()


def admin_url(admin: ModelAdmin[Any], name: str, *args: Any) -> str:
    opts = admin.model._meta
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_{name}",
        args=args,
        current_app=admin.admin_site.name,
    )


def run_url(admin: ModelAdmin[Any], run_id: str) -> str:
    return reverse(
        "admin:durable_agents_run_change", args=[quote(run_id)], current_app=admin.admin_site.name
    )


def _post_only(request: HttpRequest) -> HttpResponse | None:
    return None if request.method == "POST" else HttpResponseNotAllowed(["POST"])


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


def _missing(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    opts = admin.model._meta
    messages.warning(
        request,
        f"{opts.verbose_name} with ID {object_id!r} does not exist. Perhaps it was deleted?",
    )
    return HttpResponseRedirect(admin_url(admin, "changelist"))


def run_context(admin: ModelAdmin[Any], request: HttpRequest, run: Any) -> dict[str, Any]:
    """Everything the run page shows beyond its fields (lineage: ``admin_history``)."""
    store = DjangoStore()
    timeline_error = None
    records: list[Record] = []
    try:
        records = Journal(store).history(run.run_id)
    except DurableAgentsError as exc:
        timeline_error = str(exc)
    can_fork = request.user.has_perm(FORK_PERMISSION) and bool(records)
    approvals = [
        {"obj": a, "url": reverse("admin:durable_agents_approvalrequest_change", args=[a.pk])}
        for a in run.approval_requests.order_by("created_at")
    ]
    halts = [
        {"obj": h, "url": reverse("admin:durable_agents_halt_change", args=[h.pk])}
        for h in run.halts.order_by("created_at")
    ]
    return {
        "timeline": build_timeline(records),
        "timeline_error": timeline_error,
        **agent_drift(records, fallback=run.fingerprint),
        "fork_url": admin_url(admin, "fork", quote(run.run_id)) if can_fork else None,
        "lease": store.get_lease(run.run_id),
        "action_log": ActionLog.objects.filter(run_id=run.run_id)[:200],
        "run_approvals": approvals,
        "run_halts": halts,
        "can_operate": request.user.has_perm(OPERATE_PERMISSION),
        "run_finished": run.status in TERMINAL_STATUSES,
        "resume_url": admin_url(admin, "resume", quote(run.run_id)),
        "cancel_url": admin_url(admin, "cancel", quote(run.run_id)),
    }


# -- resume and cancel ------------------------------------------------------------------


def resume_runs(request: HttpRequest, run_ids: Iterable[str]) -> tuple[list[str], list[str]]:
    """Hand unfinished runs to a driver, logging each; returns (resumed, refused)."""
    store = DjangoStore()
    resumed, refused = [], []
    for run_id in run_ids:
        run = store.get_run(run_id)
        if run is None or run.status in TERMINAL_STATUSES:
            refused.append(f"{run_id} ({'deleted' if run is None else run.status})")
            continue
        store.log_action(ActionInfo(username(request), "resume", run_id, "", {"via": "admin"}))
        enqueue(run_id)
        resumed.append(run_id)
    return resumed, refused


def cancel_runs(
    request: HttpRequest, run_ids: Iterable[str], reason: str
) -> tuple[list[str], list[str]]:
    done, refused = [], []
    for run_id in run_ids:
        try:
            cancel(run_id, by=username(request), reason=reason)
        except DurableAgentsError as exc:
            refused.append(f"{run_id}: {exc}")
        else:
            done.append(run_id)
    return done, refused


def report(request: HttpRequest, verb: str, done: list[str], refused: list[str]) -> None:
    if done:
        messages.success(request, f"{verb}: {', '.join(done)}")
    for why in refused:
        messages.error(request, f"Not {verb.lower()}: {why}")


def run_resume_view(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    if (refusal := _post_only(request)) is not None:
        return refusal
    _require(request, OPERATE_PERMISSION)
    run = admin.get_object(request, unquote(object_id))
    if run is None:
        return _missing(admin, request, object_id)
    done, refused = resume_runs(request, [run.run_id])
    report(request, "Handed to a driver", done, refused)
    return HttpResponseRedirect(run_url(admin, run.run_id))


def run_cancel_view(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    if (refusal := _post_only(request)) is not None:
        return refusal
    _require(request, OPERATE_PERMISSION)
    run = admin.get_object(request, unquote(object_id))
    if run is None:
        return _missing(admin, request, object_id)
    reason = str(request.POST.get("reason") or "").strip()[:1000]
    done, refused = cancel_runs(request, [run.run_id], reason or "cancelled in the admin")
    report(request, "Cancelled", done, refused)
    return HttpResponseRedirect(run_url(admin, run.run_id))


# -- approvals ----------------------------------------------------------------------------


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Shown to the model with a denial, and kept in the journal.",
    )


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


def page(
    admin: ModelAdmin[Any],
    request: HttpRequest,
    template: str,
    title: str,
    context: dict[str, Any],
    status: int = 200,
) -> TemplateResponse:
    """An admin page of ``admin``'s model, outside the change form."""
    opts = admin.model._meta
    request.current_app = admin.admin_site.name
    return TemplateResponse(
        request,
        template,
        {
            **admin.admin_site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "title": title,
            "subtitle": None,
            "changelist_url": admin_url(admin, "changelist"),
            **context,
        },
        status=status,
    )


def _detail(
    admin: ModelAdmin[Any],
    request: HttpRequest,
    obj: Any,
    template: str,
    context: dict[str, Any],
) -> TemplateResponse:
    extra = {"original": obj, "has_view_permission": True, "run_url": run_url(admin, obj.run_id)}
    return page(admin, request, template, str(obj), {**extra, **context})


def approval_detail(
    admin: ModelAdmin[Any], request: HttpRequest, obj: Any, form: DecisionForm | None = None
) -> TemplateResponse:
    can_decide = request.user.has_perm(APPROVE_PERMISSION) and obj.status == APPROVAL_PENDING
    return _detail(
        admin,
        request,
        obj,
        "admin/durable_agents/approvalrequest/detail.html",
        {
            "arguments": pretty(obj.arguments),
            "run_input": pretty(obj.run.input),
            "policy": pretty(obj.policy),
            "progress": progress(obj.policy, obj.n_approved, obj.n_denied),
            "decisions": obj.decisions.order_by("created_at"),
            "can_decide": can_decide,
            "form": form or DecisionForm(),
            "decide_url": admin_url(admin, "decide", obj.pk),
        },
    )


def approval_decide_view(
    admin: ModelAdmin[Any], request: HttpRequest, object_id: str
) -> HttpResponse:
    if (refusal := _post_only(request)) is not None:
        return refusal
    _require(request, APPROVE_PERMISSION)
    obj = admin.get_object(request, unquote(object_id))
    if obj is None:
        return _missing(admin, request, object_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return approval_detail(admin, request, obj, form)
    approved = form.cleaned_data["decision"] == "approve"
    here = HttpResponseRedirect(admin_url(admin, "change", obj.pk))
    try:
        outcome = approve(
            obj.run_id,
            obj.call_id,
            approved,
            by=username(request),
            note=form.cleaned_data["note"],
        )
    except DurableAgentsError as exc:
        messages.error(request, f"{exc} [{exc.code}]")
        return here
    if obj.status != APPROVAL_PENDING:  # the same decision again: the standing one
        messages.info(request, f"Call {obj.call_id} was already {outcome.status}; nothing changed.")
    elif outcome.status == APPROVAL_PENDING:
        tally = outcome.tally
        messages.success(
            request,
            f"Your decision on call {obj.call_id} is recorded: "
            f"{len(tally.get('approved_by') or ())} of {tally.get('need')} approved so far.",
        )
    else:
        messages.success(
            request,
            f"Call {obj.call_id} of run {obj.run_id} is {outcome.status}; the run was handed to a "
            "driver.",
        )
    return here


# -- halts --------------------------------------------------------------------------------


def json_field(value: str, label: str) -> Any:
    """Parse a form's JSON text; NaN and Infinity are refused (they are not JSON)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(value, parse_constant=refuse)
    except ValueError as exc:
        raise forms.ValidationError(f"{label} is not valid JSON: {exc}") from None


class ResolveForm(forms.Form):
    result = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "da-mono"}),
        help_text='What the call really returned, as JSON: {"refunded": 500}, "done", null…',
    )
    is_error = forms.BooleanField(
        required=False, help_text="The effect failed: the model reads the result as an error."
    )
    evidence = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "class": "da-mono"}),
        help_text='Optional JSON: how you know, e.g. {"provider_ref": "re_123"}.',
    )
    min_age = forms.FloatField(
        required=False,
        min_value=0,
        help_text="Optional: refuse if the attempt is younger than this many seconds.",
    )

    def clean_result(self) -> Any:
        return json_field(self.cleaned_data["result"], "The result")

    def clean_evidence(self) -> Any:
        text = self.cleaned_data["evidence"].strip()
        return json_field(text, "The evidence") if text else None


def halt_detail(
    admin: ModelAdmin[Any], request: HttpRequest, obj: Any, form: ResolveForm | None = None
) -> TemplateResponse:
    return _detail(
        admin,
        request,
        obj,
        "admin/durable_agents/halt/detail.html",
        {
            "arguments": pretty(obj.arguments),
            "resolution": pretty(obj.resolution) if obj.resolution is not None else None,
            "lease": DjangoStore().get_lease(obj.run_id),
            "can_resolve": request.user.has_perm(RESOLVE_PERMISSION) and obj.status == HALT_OPEN,
            "form": form or ResolveForm(),
            "resolve_url": admin_url(admin, "resolve", obj.pk),
        },
    )


def halt_resolve_view(admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> HttpResponse:
    if (refusal := _post_only(request)) is not None:
        return refusal
    _require(request, RESOLVE_PERMISSION)
    obj = admin.get_object(request, unquote(object_id))
    if obj is None:
        return _missing(admin, request, object_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return halt_detail(admin, request, obj, form)
    data = form.cleaned_data
    try:
        resolve_halt(
            obj.run_id,
            obj.op_id,
            data["result"],
            is_error=data["is_error"],
            evidence=data["evidence"],
            by=username(request),
            min_age=data["min_age"],
        )
    except DurableAgentsError as exc:
        form.add_error(None, f"{exc} [{exc.code}]")
        messages.error(request, f"Nothing was recorded: {exc} [{exc.code}]")
        return halt_detail(admin, request, obj, form)
    messages.success(
        request,
        f"Recorded the outcome of call {obj.op_id}; run {obj.run_id} was handed to a driver.",
    )
    return HttpResponseRedirect(admin_url(admin, "change", obj.pk))
