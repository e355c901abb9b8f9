"""The admin's own pages and POST handlers: the journal timeline, the approval decision, the
halt resolution, resume and cancel.

Glue only: every change goes through an engine command (``approve``, ``resolve_halt``,
``cancel``) or ``dispatch.enqueue``; nothing here sets a status. Each handler checks its own
permission, so a POST made without the button is refused the same way.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .dispatch import enqueue
from .engine.approvals import approve
from .engine.commands import cancel
from .engine.errors import DurableAgentsError
from .engine.halts import resolve_halt
from .engine.journal import Journal
from .engine.ports import APPROVAL_PENDING, HALT_OPEN, TERMINAL_STATUSES, ActionInfo
from .engine.records import Record
from .models import ActionLog, ApproverKey
from .storage import DjangoStore

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

APPROVE_PERMISSION = "durable_agents.approve_toolcall"
RESOLVE_PERMISSION = "durable_agents.resolve_halt"
OPERATE_PERMISSION = "durable_agents.cancel_run"  # "operate runs": cancel and resume


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept as itself."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def pretty_text(text: Any) -> str:
    """A JSON text (tool call arguments are sent as text) pretty-printed, or as it is."""
    if not isinstance(text, str):
        return pretty(text)
    try:
        return pretty(json.loads(text))
    except ValueError:
        return text


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


# -- the journal timeline ---------------------------------------------------------------


def _ms(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if isinstance(value, int | float) else None


def _entry(rec: Record, kind: str, title: str, **extra: Any) -> dict[str, Any]:
    return {
        "seq": rec.seq,
        "name": rec.name,
        "at": rec.created_at,
        "kind": kind,
        "title": title,
        "meta": extra.pop("meta", []),
        "text": extra.pop("text", None),
        "calls": extra.pop("calls", []),
        "sections": [{"label": k, "json": v} for k, v in extra.pop("sections", [])],
    }


def _usage(usage: Any) -> str:
    if not isinstance(usage, dict):
        return ""
    return f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"


def _describe(rec: Record) -> dict[str, Any]:
    name, body = rec.name, rec.body
    if name == "@journal":
        return _entry(rec, "meta", f"Journal opened (format {body.get('format')})")
    if name == "run:start":
        value = body.get("input")
        return _entry(
            rec,
            "start",
            f"Run started by agent {body.get('agent')!r}",
            text=value if isinstance(value, str) else None,
            sections=[] if isinstance(value, str) else [("input", pretty(value))],
        )
    if name.startswith("model:"):
        message = body.get("message") or {}
        calls = [
            {
                "id": c.get("id"),
                "name": c.get("name"),
                "arguments": pretty_text(c.get("arguments")),
            }
            for c in message.get("tool_calls") or ()
        ]
        meta = [f"model {body.get('model')}", f"finish {body.get('finish')}"]
        meta.append(_usage(body.get("usage")))
        return _entry(
            rec,
            "model",
            f"Model turn {name[6:]}",
            text=message.get("content") or None,
            calls=calls,
            meta=meta,
        )
    if name.startswith(("attempt:", "not-started:")):
        prefix, rest = name.split(":", 1)
        call, _, k = rest.rpartition(":")
        if prefix == "attempt":
            at = _ms(body.get("attempted_at"))
            meta = [f"tool {body.get('tool')}"] + (
                [f"attempted at {at:%Y-%m-%d %H:%M:%S}"] if at else []
            )
            return _entry(rec, "attempt", f"Attempt {k} of call {call} claimed", meta=meta)
        return _entry(rec, "attempt", f"Attempt {k} of call {call} never started")
    if name.startswith("tool:"):
        flags = ["error"] if body.get("is_error") else ["ok"]
        if body.get("read_only"):
            flags.append("read-only")
        sections = [("result", pretty(body.get("result")))]
        if body.get("reconciled"):
            flags.append(f"outcome recorded by {body.get('by') or 'a person'}")
            if body.get("evidence") is not None:
                sections.append(("evidence", pretty(body.get("evidence"))))
        return _entry(
            rec,
            "tool-error" if body.get("is_error") else "tool",
            f"Result of call {name[5:]} ({body.get('name')})",
            meta=flags,
            sections=sections,
        )
    if name.startswith("approval:"):
        verdict = "approved" if body.get("approved") else "denied"
        tally = body.get("tally") or {}
        meta = [f"need {tally.get('need', 1)}"]
        if tally.get("approved_by"):
            meta.append("approved by " + ", ".join(tally["approved_by"]))
        if tally.get("denied_by"):
            meta.append("denied by " + ", ".join(tally["denied_by"]))
        return _entry(
            rec,
            "approval" if body.get("approved") else "denial",
            f"Call {name[9:]} {verdict} by {body.get('by')}",
            text=body.get("note") or None,
            meta=meta,
            sections=[("tally", pretty(tally))],
        )
    if name == "run:complete":
        meta = [f"{body.get('turns')} turns", _usage(body.get("spend") or body.get("usage"))]
        return _entry(rec, "complete", "Run finished", text=body.get("answer"), meta=meta)
    if name == "run:cancelled":
        return _entry(
            rec, "cancelled", f"Run cancelled by {body.get('by')}", text=body.get("reason") or None
        )
    if name.startswith("@drift/"):
        return _entry(
            rec,
            "drift",
            "Resumed under a changed agent",
            sections=[("changes", pretty(body.get("changes")))],
        )
    if name.startswith("@spend/"):
        return _entry(
            rec,
            "meta",
            f"Model spend without a turn ({body.get('why')})",
            meta=[_usage(body.get("usage"))],
        )
    if name.startswith("user:"):
        text = body.get("text")
        return _entry(
            rec, "start", "User message", text=text if isinstance(text, str) else pretty(text)
        )
    if name.startswith("step:"):
        return _entry(
            rec, "meta", f"Step {name[5:]}", sections=[("value", pretty(body.get("value")))]
        )
    return _entry(rec, "meta", name, sections=[("record", pretty(body))])


def build_timeline(records: Iterable[Record]) -> list[dict[str, Any]]:
    """The journal as a list of plain dicts a template can print without logic."""
    out = []
    for rec in records:
        try:
            out.append(_describe(rec))
        except (DurableAgentsError, AttributeError, KeyError, TypeError, ValueError) as exc:
            # An unreadable or oddly shaped record is shown as such; the page still renders.
            out.append(_entry(rec, "tool-error", f"{rec.name}: unreadable", text=str(exc)))
    return out


def run_context(admin: ModelAdmin[Any], request: HttpRequest, run: Any) -> dict[str, Any]:
    """Everything the run page shows beyond its fields."""
    store = DjangoStore()
    timeline_error = None
    try:
        timeline = build_timeline(Journal(store).history(run.run_id))
    except DurableAgentsError as exc:
        timeline, timeline_error = [], str(exc)
    approvals = [
        {"obj": a, "url": reverse("admin:durable_agents_approvalrequest_change", args=[a.pk])}
        for a in run.approval_requests.order_by("created_at")
    ]
    halts = [
        {"obj": h, "url": reverse("admin:durable_agents_halt_change", args=[h.pk])}
        for h in run.halts.order_by("created_at")
    ]
    return {
        "timeline": timeline,
        "timeline_error": timeline_error,
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


def _detail(
    admin: ModelAdmin[Any],
    request: HttpRequest,
    obj: Any,
    template: str,
    context: dict[str, Any],
) -> TemplateResponse:
    opts = admin.model._meta
    request.current_app = admin.admin_site.name
    return TemplateResponse(
        request,
        template,
        {
            **admin.admin_site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "original": obj,
            "title": str(obj),
            "subtitle": None,
            "has_view_permission": True,
            "run_url": run_url(admin, obj.run_id),
            **context,
        },
    )


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


def _json_field(value: str, label: str) -> Any:
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
        return _json_field(self.cleaned_data["result"], "The result")

    def clean_evidence(self) -> Any:
        text = self.cleaned_data["evidence"].strip()
        return _json_field(text, "The evidence") if text else None


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


# -- keys ---------------------------------------------------------------------------------


def _clean_public_key(value: str) -> str:
    value = "".join(value.split())
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise forms.ValidationError("The key is not valid base64.") from None
    if len(raw) != 32:
        raise forms.ValidationError(
            f"An Ed25519 public key is exactly 32 bytes; this one is {len(raw)}."
        )
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise forms.ValidationError("These 32 bytes are not an Ed25519 public key.") from None
    return base64.b64encode(raw).decode()


if TYPE_CHECKING:
    _KeyForm = forms.ModelForm[ApproverKey]
else:
    _KeyForm = forms.ModelForm


class ApproverKeyForm(_KeyForm):
    class Meta:
        model = ApproverKey
        fields = ["approver", "public_key"]
        help_texts = {"public_key": "The raw 32-byte Ed25519 public key, base64."}

    def clean_public_key(self) -> str:
        return _clean_public_key(self.cleaned_data["public_key"])


def key_created(
    admin: ModelAdmin[Any], request: HttpRequest, obj: Any, raw_key: str
) -> TemplateResponse:
    """The one page that shows a new API key: rendered directly (no redirect), so the raw
    key never sits in the session or a messages cookie."""
    opts = admin.model._meta
    request.current_app = admin.admin_site.name
    return TemplateResponse(
        request,
        "admin/durable_agents/apikey/created.html",
        {
            **admin.admin_site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "original": obj,
            "title": f"API key “{obj.name}” created",
            "raw_key": raw_key,
            "changelist_url": admin_url(admin, "changelist"),
        },
        headers={"Cache-Control": "no-store"},
    )
