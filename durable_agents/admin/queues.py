"""The two queues staff work through: tool calls awaiting approval and halted side effects.
Each opens on what is still waiting, and each item has its own page with the one command it
takes: ``approve`` (decide) or ``resolve_halt`` (record the outcome). Approvals are also
decided from the list, inline and in bulk (``deciding``). Registered when
``durable_agents.admin`` imports this module."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet, prefetch_related_objects
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..celery.dispatch import deferred
from ..database import reads
from ..engine.approvals import NOT_SHOWN, arguments_digest
from ..engine.commands.halts import resolve_halt
from ..engine.errors import ApprovalArgumentsChanged, ApprovalEditInvalid, DurableAgentsError
from ..engine.ports import APPROVAL_PENDING, HALT_OPEN, IMPORTED_INERT
from ..engine.views import decided_by, late_results
from ..models import ApprovalRequest, Decision, Halt, Lease
from ..rule_state import rule_state
from . import counts, live
from .base import (
    BY_RECOVERY,
    AnyModelAdmin,
    DefaultStatusFilter,
    ReadOnlyAdmin,
    admin_actor,
    admin_url,
    allows,
    json_cell,
    json_cut,
    json_field,
    not_handed_over,
    object_gone,
    page,
    posted_object,
    related_count,
    run_url,
    short_time,
    status_pill,
)
from .deciding import (
    Decided,
    bulk_decide,
    decide_call,
    progress,
    shown_arguments,
    tell,
    ways_by_row,
)
from .pretty import pretty
from .readable import (
    conversation,
    edit_changes,
    policy_words,
    stated_reason,
    summary_of,
    tool_of,
)
from .rendered import identifying_of, in_schema_order, render


class _QueueAdmin(ReadOnlyAdmin):
    """A queue whose items are seen by whoever may read them (``view_action`` in
    ``durable_agents.permissions``: its view permission or the one that acts on it), each
    on its own page (``detail``) rather than the read-only change form."""

    view_action = ""
    # The moment a row's call cell shows: when it came, or (halts) when it was attempted.
    when_field, when_words = "created_at", ""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or allows(request, self.view_action)

    def has_module_permission(self, request: HttpRequest) -> bool:
        allowed = super().has_module_permission(request)
        if allowed:
            counts.note_on_index(request)  # how much waits, on the admin index
        return allowed

    def detail(self, request: HttpRequest, obj: Any) -> HttpResponse:
        raise NotImplementedError

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            return object_gone(self, request, object_id)
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return self.detail(request, obj)

    @admin.display(description="status", ordering="status")
    def status_pill(self, obj: Any) -> str:
        return status_pill(obj.status)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj: Any) -> str:
        return json_cell(obj.arguments)

    @admin.display(description="call", ordering="created_at")
    def call_cell(self, obj: Any) -> str:
        """What and where in one cell (a list that fits beside the admin's menus): the tool
        and call (a link to the call's page), its run and the tree's root, when it came."""
        root = obj.run.root_run_id
        when = getattr(obj, self.when_field)
        return format_html(
            '<a href="{}" class="da-call-link"><strong>{}</strong></a> <code>{}</code>'
            '<div class="da-cell-line">run <a href="{}">{}</a>{}</div>'
            '<div class="da-cell-line da-at">{}{}</div>',
            admin_url(self, "change", obj.pk),
            obj.tool_name,
            obj.call_id if hasattr(obj, "call_id") else obj.op_id,
            run_url(self, obj.run_id),
            obj.run_id,
            format_html(' · root <a href="{}">{}</a>', run_url(self, root), root) if root else "",
            self.when_words,
            short_time(when) if when else "",
        )


def _detail(
    admin: AnyModelAdmin,
    request: HttpRequest,
    obj: Any,
    template: str,
    context: dict[str, Any],
) -> TemplateResponse:
    extra = {"original": obj, "has_view_permission": True, "run_url": run_url(admin, obj.run_id)}
    return page(admin, request, template, str(obj), {**extra, **context})


# -- approvals ----------------------------------------------------------------------------


class DecisionForm(forms.Form):
    """Approve, edit and approve, or deny (with a note the model reads)."""

    decision = forms.ChoiceField(
        choices=[("approve", "Approve"), ("edit", "Approve with edits"), ("deny", "Deny")]
    )
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="With a denial, the message the model reads as the call's result; kept in "
        "the journal either way.",
    )
    edit = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "da-mono"}),
        help_text="Approve with edits: the arguments that run instead, as a JSON object. "
        "They are checked against the tool's schema.",
    )
    # The arguments the page showed (``shown_arguments``): the decision is for those, and
    # the engine refuses it (``approval.arguments_changed``) if the call asks about others
    # by the time it is submitted (a deploy asked again meanwhile).
    shown = forms.CharField(required=False, widget=forms.HiddenInput)
    # Whom a deputy decides for (``engine.delegation``); empty: the person deciding.
    for_approver = forms.CharField(required=False, max_length=200)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["edited"] = None
        shown = data.get("shown") or ""
        data["shown"] = NOT_SHOWN
        try:
            data["shown"] = json.loads(shown)
        except ValueError:
            # The decide view refuses a post without it first; here it came back garbled.
            self.add_error(
                None,
                "The arguments this page showed came back garbled or not at all; nothing "
                "was done. Open the call again and decide there.",
            )
            return data
        if data.get("decision") == "edit":
            try:
                edited = json.loads(data.get("edit") or "")
            except ValueError:
                self.add_error("edit", "Not valid JSON.")
                return data
            if not isinstance(edited, dict):
                self.add_error("edit", "The arguments must be a JSON object: {...}.")
                return data
            data["edited"] = edited
        return data


def editable(obj: ApprovalRequest) -> bool:
    """Whether the call's tool (as loaded here) lets an approver edit its arguments."""
    tool = tool_of(obj)
    return tool is not None and tool.safety.editable


class ApprovalStatusFilter(DefaultStatusFilter):
    default = APPROVAL_PENDING
    options = [(s, label) for s, label in ApprovalRequest.STATUSES]


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(_QueueAdmin):
    # Few columns, so the list fits beside the admin's menus at 1400 px: the call (what,
    # where, when), its arguments, how far its approval is, its status and the buttons.
    list_display = ("call_cell", "arguments_pretty", "quorum", "status_pill")
    list_display_links = None  # the call cell links the call's page itself
    list_filter = (ApprovalStatusFilter, "tool_name")
    search_fields = ("run__run_id", "call_id", "tool_name")
    list_select_related = ("run",)
    view_action = "view_approvals"
    actions = ["approve_selected", "deny_selected"]

    class Media:
        js = ("durable_agents/live.js",)  # the queue refreshes its rows (admin.live)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalRequest]:
        rows: QuerySet[ApprovalRequest] = (
            super()
            .get_queryset(request)
            # An inert import's requests are evidence (on its run's page), not work.
            .exclude(run__imported=IMPORTED_INERT)
            .annotate(
                n_approved=related_count(Decision, "request", approved=True),
                n_denied=related_count(Decision, "request", approved=False),
                # Deadlines are counted on the database's clock, as the sweep takes them.
                db_now=Now(),
            )
        )
        return rows

    def get_urls(self) -> list[URLPattern]:
        return [
            self.command_path("decide", approval_decide_view),
            self.command_path("pending", live.pending_view, "pending.json"),
            *super().get_urls(),
        ]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, each row told whether this person may decide it: the inbox's one
        eligibility check (``ways_by_row``), asked once for the page's rows."""
        changelist = super().get_changelist_instance(request)
        if allows(request, "decide"):
            rows = list(changelist.result_list)  # the page's rows, cached: these objects render
            pending = [o for o in rows if o.status == APPROVAL_PENDING]
            # Who voted, for a deputy's check (one query for the page).
            prefetch_related_objects(pending, "decisions")
            ways = ways_by_row(request, pending)
            for obj in rows:
                way = ways.get(obj.pk)
                obj.da_refused = way.refused if way is not None else ""
                # Deputy of several approvers: the call's page asks for whom.
                obj.da_choose = way is not None and len(way.for_approvers) > 1
        return changelist

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))
        if allows(request, "decide"):  # beside the status, before where the call waits
            shown.insert(shown.index("status_pill") + 1, "decide_here")
        return tuple(shown)

    # The actions' ``permissions=["decide"]`` (Django asks ``has_decide_permission``).
    def has_decide_permission(self, request: HttpRequest) -> bool:
        return allows(request, "decide")

    @admin.action(description="Approve selected calls", permissions=["decide"])
    def approve_selected(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]
    ) -> HttpResponse | None:
        return bulk_decide(self, request, queryset, approved=True)

    @admin.action(description="Deny selected calls", permissions=["decide"])
    def deny_selected(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]
    ) -> HttpResponse | None:
        return bulk_decide(self, request, queryset, approved=False)

    @admin.display(description="decide")
    def decide_here(self, obj: ApprovalRequest) -> str:
        """Approve / Deny buttons that post the list's own form (its CSRF token) to the
        call's decide URL: the same view as the call's page. A denial from here has no
        message; write one on the call's page or with "Deny selected"."""
        if obj.status != APPROVAL_PENDING:
            return ""
        refused = getattr(obj, "da_refused", None)
        if refused is None or refused:
            # Not asked (a row drawn outside this list) or refused: no buttons to a decision
            # the engine would refuse; the call's page says why.
            return format_html(
                '<span class="da-row-refused" title="{}">You may not decide this call</span>',
                refused or "open the call to decide",
            )
        if json_cut(obj.arguments) or rule_state(obj).moved or getattr(obj, "da_choose", False):
            # The row shows only the start of the arguments: a decision here would be for
            # more than the approver saw. The call's page shows them whole. (An edit moved
            # the call under a stricter rule: it is approved only with that edit, which the
            # call's page holds; a plain approval from here would be refused. A deputy of
            # several approvers says there for whom they decide.)
            return format_html(
                '<a href="{}" class="button da-row-open">Open to decide</a>',
                admin_url(self, "change", obj.pk),
            )
        # What this row shows travels in the URL (the list's form has no field for it), as
        # a digest: arguments can be longer than a server takes in a request line.
        shown = arguments_digest(obj.arguments).hex()
        url = (
            admin_url(self, "decide", obj.pk)
            + "?"
            + urlencode({"back": "queue", "shown_sha256": shown})
        )
        return format_html(
            '<button type="submit" formaction="{}" formmethod="post" formnovalidate '
            'name="decision" value="approve" class="button da-row-approve">Approve</button> '
            '<button type="submit" formaction="{}" formmethod="post" formnovalidate '
            'name="decision" value="deny" class="button da-danger da-row-deny">Deny</button>',
            url,
            url,
        )

    def detail(self, request: HttpRequest, obj: Any) -> HttpResponse:
        return approval_detail(self, request, obj)

    @admin.display(description="arguments")
    def arguments_pretty(self, obj: Any) -> str:
        """The tool's summary of the call (when it has one) above the arguments' JSON."""
        tool = tool_of(obj)
        summary = summary_of(tool, obj.arguments)
        # In the schema's order, what identifies the call first: PostgreSQL keeps shorter
        # keys first (a padded memo before the payee); what the tool puts first is what the
        # row shows first.
        cell = json_cell(
            in_schema_order(getattr(tool, "parameters", None), obj.arguments, identifying_of(tool))
        )
        return (
            format_html('<strong class="da-summary">{}</strong>{}', summary, cell)
            if summary
            else cell
        )

    @admin.display(description="approval")
    def quorum(self, obj: Any) -> str:
        """How far its approval is, the rule that asked and why, and its deadline."""
        state = rule_state(obj)
        deadline = state.deadline.text if state.deadline else ""
        return format_html(
            "{}{}{}",
            progress(obj.policy, obj.n_approved, obj.n_denied),
            format_html('<div class="da-cell-line da-rule-cell">{}</div>', state.text)
            if state.rule
            else "",
            format_html(
                '<div class="da-cell-line da-deadline{}">{}</div>',
                " da-rule-urgent" if state.deadline and state.deadline.urgent else "",
                deadline,
            )
            if deadline
            else "",
        )


def approval_detail(
    admin: AnyModelAdmin, request: HttpRequest, obj: Any, form: DecisionForm | None = None
) -> TemplateResponse:
    can_decide = allows(request, "decide") and obj.status == APPROVAL_PENDING
    # The inbox's eligibility check: no form for a call the engine would refuse this person.
    ways = ways_by_row(request, [obj]).get(obj.pk) if can_decide else None
    refused = ways.refused if ways is not None else ""
    can_decide = can_decide and not refused
    tool = tool_of(obj)
    records: list[Any] = []
    try:  # one read of the journal; a record that cannot be read leaves the rest shown
        records = reads.journal(obj.run_id)
        talk, talk_error = conversation(records, obj.call_id), ""
    except DurableAgentsError as exc:
        talk, talk_error = [], str(exc)
    # The call's page shows the arguments whole: it is where a folded card sends the
    # approver, and where editing starts.
    shown = render(
        getattr(tool, "parameters", None), obj.arguments, whole=True, first=identifying_of(tool)
    )
    state = rule_state(obj)
    # An edit moved the call under a stricter rule: only that edit may be approved, so
    # the edit box starts from it.
    prefill = state.moved_arguments if state.moved else obj.arguments
    return _detail(
        admin,
        request,
        obj,
        "admin/durable_agents/approvalrequest/detail.html",
        {
            "arguments": pretty(obj.arguments),
            "previous_arguments": (
                pretty(obj.previous_arguments) if obj.previous_arguments is not None else None
            ),
            "run_input": pretty(obj.run.input),
            "conversation": talk,
            "conversation_error": talk_error,
            "policy": pretty(obj.policy),
            "policy_words": policy_words(obj.policy, obj.n_approved),
            "description": getattr(tool, "description", ""),
            "summary": summary_of(tool, obj.arguments),
            "shown": shown,
            "covers": [f for f in shown.fields if f.identifying],  # the decision bar names
            "reason": stated_reason(records, obj.call_id),
            "progress": progress(obj.policy, obj.n_approved, obj.n_denied),
            "rule": state,
            "changes": edit_changes(tool, obj.arguments, state.moved_arguments)
            if state.moved
            else [],
            "decisions": obj.decisions.order_by("created_at"),
            "decided_by": _decided_by(records, obj),
            "can_decide": can_decide,
            # A deputy decides for one of these (``engine.delegation``): the form says whom.
            "deciding_for": list(ways.for_approvers) if ways is not None and can_decide else [],
            "refused": refused,
            "editable": can_decide and editable(obj),
            "form": form
            or DecisionForm(initial={"edit": pretty(prefill), "shown": shown_arguments(obj)}),
            "decide_url": admin_url(admin, "decide", obj.pk),
        },
    )


def _decided_by(records: list[Any], obj: Any) -> str:
    """Who the journal's decision on the call names ("dora for lena" when a deputy made it);
    "" while it is undecided. The last decision on the call: a call asked again is decided
    again."""
    if obj.status == APPROVAL_PENDING:
        return ""
    return decided_by(records, obj.call_id)


def approval_decide_view(
    admin: AnyModelAdmin, request: HttpRequest, object_id: str
) -> HttpResponse:
    obj = posted_object(admin, request, object_id, "decide")
    if isinstance(obj, HttpResponse):
        return obj
    # Decided from the run page's banner, the queue or the inbox: back there, where the new
    # state shows.
    came_from = request.POST.get("back") or request.GET.get("back") or ""
    back = {
        "run": run_url(admin, obj.run_id),
        "queue": admin_url(admin, "changelist"),
        "inbox": reverse("admin:durable_agents_inbox", current_app=admin.admin_site.name),
    }.get(came_from)
    posted = request.POST.copy()
    digest = request.GET.get("shown_sha256")
    if not posted.get("shown") and not digest:
        # Every page that draws a decision posts what it showed whole (``shown``, or a queue
        # row's digest); ``back`` is only where to return, so it vouches for nothing. Without
        # them this came from a folded card, or was made by hand: a decision for arguments
        # nobody saw.
        tell(
            request,
            Decided(
                "refused",
                f"Nothing was decided on call {obj.call_id} of run {obj.run_id}: the decision "
                "did not say which arguments it was shown whole. Open the call (or its card, "
                "whole: Show all to decide) and decide there. [approval.not_shown_whole]",
            ),
        )
        return HttpResponseRedirect(back or admin_url(admin, "change", obj.pk))
    if not posted.get("shown"):
        # A queue row's buttons (``decide_here``) carry the digest of what the row showed.
        if digest != arguments_digest(obj.arguments).hex():
            changed = ApprovalArgumentsChanged(
                f"call {obj.call_id!r} of run {obj.run_id!r} now asks about other arguments "
                "than the list showed; look at it again before deciding"
            )
            tell(request, Decided("refused", f"{changed} [{changed.code}]"))
            return HttpResponseRedirect(back or admin_url(admin, "change", obj.pk))
        # The arguments read here are the ones shown; the engine checks them against its
        # own read, so a change after this one is refused too.
        posted["shown"] = shown_arguments(obj)
    form = DecisionForm(posted)
    if not form.is_valid():
        return approval_detail(admin, request, obj, form)
    approved = form.cleaned_data["decision"] != "deny"
    try:
        decided = decide_call(
            request,
            obj,
            approved,
            form.cleaned_data["note"],
            edit=form.cleaned_data["edited"],
            arguments=form.cleaned_data["shown"],
            for_approver=form.cleaned_data["for_approver"] or None,
        )
    except ApprovalEditInvalid as exc:  # bad input: a form error, nothing written
        form.add_error("edit", str(exc))
        return approval_detail(admin, request, obj, form)
    tell(request, decided)
    return HttpResponseRedirect(back or admin_url(admin, "change", obj.pk))


# -- halts --------------------------------------------------------------------------------


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
        help_text="Optional: refuse if the attempt is younger than this many seconds. The "
        "HALT_MIN_AGE setting (by default twice LEASE_TTL) applies in any case.",
    )

    def clean_result(self) -> Any:
        return json_field(self.cleaned_data["result"], "The result")

    def clean_evidence(self) -> Any:
        text = self.cleaned_data["evidence"].strip()
        return json_field(text, "The evidence") if text else None


class HaltStatusFilter(DefaultStatusFilter):
    default = HALT_OPEN
    options = [(s, label) for s, label in Halt.STATUSES]


@admin.register(Halt)
class HaltAdmin(_QueueAdmin):
    # Few columns, as the approval queue's, so the list fits beside the admin's menus at
    # 1400 px: the call (what, where, when it was attempted), its arguments, why it halted,
    # its status and whether a driver still holds the run.
    list_display = ("call_cell", "arguments_pretty", "cause", "status_pill", "lease_live")
    list_display_links = None  # the call cell links the halt's page itself
    when_field, when_words = "attempted_at", "attempted "
    list_filter = (HaltStatusFilter, "cause")
    search_fields = ("run__run_id", "op_id", "tool_name")
    list_select_related = ("run",)
    view_action = "view_halts"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Halt]:
        live = Lease.objects.filter(run_id=OuterRef("run_id"), expires_at__gt=Now())
        rows: QuerySet[Halt] = (
            super()
            .get_queryset(request)
            .exclude(run__imported=IMPORTED_INERT)
            .annotate(has_live_lease=Exists(live))
        )
        return rows

    def get_urls(self) -> list[URLPattern]:
        return [self.command_path("resolve", halt_resolve_view), *super().get_urls()]

    def detail(self, request: HttpRequest, obj: Any) -> HttpResponse:
        return halt_detail(self, request, obj)

    @admin.display(description="driver holds lease", boolean=True, ordering="has_live_lease")
    def lease_live(self, obj: Any) -> bool:
        return bool(obj.has_live_lease)


def halt_detail(
    admin: AnyModelAdmin, request: HttpRequest, obj: Any, form: ResolveForm | None = None
) -> TemplateResponse:
    tool = tool_of(obj)
    return _detail(
        admin,
        request,
        obj,
        "admin/durable_agents/halt/detail.html",
        {
            "arguments": pretty(obj.arguments),
            # The halt page shows the arguments whole: a person records what happened to
            # the call as it ran, all of it.
            "shown": render(
                getattr(tool, "parameters", None),
                obj.arguments,
                whole=True,
                first=identifying_of(tool),
            ),
            "description": getattr(tool, "description", "") or "",
            "reason": obj.reason if isinstance(obj.reason, dict) else None,
            "resolution": pretty(obj.resolution) if obj.resolution is not None else None,
            "late": late_evidence(obj.run_id, obj.op_id),
            "lease": reads.lease(obj.run_id),
            "can_resolve": allows(request, "resolve") and obj.status == HALT_OPEN,
            "form": form or ResolveForm(),
            "resolve_url": admin_url(admin, "resolve", obj.pk),
        },
    )


def late_evidence(run_id: str, op_id: str) -> list[dict[str, Any]]:
    """What drivers that had lost the run saw when the call settled (``@late/<call>/<k>``
    records): evidence for the person resolving, never the call's result."""
    return [
        {
            "name": rec.name,
            "at": rec.created_at,
            "outcome": rec.get("outcome"),
            "holder": rec.get("holder"),
            "result": pretty(rec.get("result")),
        }
        for rec in late_results(reads.journal(run_id), op_id)
    ]


def halt_resolve_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    obj = posted_object(admin, request, object_id, "resolve")
    if isinstance(obj, HttpResponse):
        return obj
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return halt_detail(admin, request, obj, form)
    data = form.cleaned_data
    try:
        with deferred() as late:
            resolve_halt(
                obj.run_id,
                obj.op_id,
                data["result"],
                is_error=data["is_error"],
                evidence=data["evidence"],
                by=admin_actor(request),
                min_age=data["min_age"],
            )
    except DurableAgentsError as exc:
        # Said once: on the form when the page shows it (the halt is open), else as a message.
        refusal = f"Nothing was recorded: {exc} [{exc.code}]"
        if obj.status == HALT_OPEN:
            form.add_error(None, refusal)
        else:
            messages.error(request, refusal)
        return halt_detail(admin, request, obj, form)
    if late:  # the outcome is recorded and the run queued; only the message failed
        recorded = f"The outcome of call {obj.op_id} is recorded and run {obj.run_id} queued"
        not_handed_over(request, recorded, late[0].error, BY_RECOVERY)
        return HttpResponseRedirect(admin_url(admin, "change", obj.pk))
    messages.success(
        request,
        f"Recorded the outcome of call {obj.op_id}; run {obj.run_id} was handed to a driver.",
    )
    return HttpResponseRedirect(admin_url(admin, "change", obj.pk))
