"""Delegations in the admin (``/admin/durable_agents/delegation/``): who decides for an
approver who is away. Recorded and revoked only through the engine's commands
(``durable_agents.delegate``, ``revoke_delegation``), which log each; never edited.

An approver (``approve_toolcall``) sees the delegations naming them, as approver or deputy,
records their own and ends them (or declines one naming them as deputy); a holder of
``delegate_approvals`` sees, records and revokes everyone's. The list reads its page in a
fixed number of queries; each row's state (upcoming, in force, ended, revoked) is judged
by the database's clock in the same query.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern
from django.utils.html import format_html

from ..database.reads import IN_FORCE, UPCOMING, in_state, with_state
from ..engine.commands.delegations import NOTE_MAX, delegate, revoke
from ..engine.errors import DurableAgentsError
from ..models import Delegation
from ..people import approvers
from .base import CSS, ReadOnlyAdmin, admin_actor, admin_url, allows, page, short_time

_LOCAL = "%Y-%m-%dT%H:%M"


def _when(**attrs: Any) -> forms.DateTimeInput:
    return forms.DateTimeInput(attrs={"type": "datetime-local", **attrs}, format=_LOCAL)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.replace("\n", ",").split(",") if n.strip()]


class DelegationForm(forms.Form):
    """A new delegation; the engine checks it again (and decides who may record it)."""

    approver = forms.ChoiceField(help_text="Who is away.")
    deputy = forms.ChoiceField(help_text="Who decides for them: a person who may decide calls.")
    starts_at = forms.DateTimeField(
        required=False,
        widget=_when(),
        help_text="In the site's time zone; empty, or in the past: from now.",
    )
    ends_at = forms.DateTimeField(
        widget=_when(required=True), help_text="Until when, in the site's time zone."
    )
    groups = forms.CharField(
        required=False,
        help_text="Only calls asked of these groups (comma-separated); empty: any.",
    )
    tools = forms.CharField(
        required=False, help_text="Only these tools (comma-separated); empty: any."
    )
    note = forms.CharField(
        required=False, max_length=NOTE_MAX, widget=forms.Textarea(attrs={"rows": 2})
    )

    def __init__(self, *args: Any, request: HttpRequest, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        me = request.user.get_username()
        # People who may decide calls: one query. Anyone else is refused by the engine too.
        people = sorted(u.get_username() for u in approvers())
        approver_field: Any = self.fields["approver"]
        deputy_field: Any = self.fields["deputy"]
        if allows(request, "delegate"):
            approver_field.choices = [(p, p) for p in people]
        else:  # one's own only: a posted name of someone else is "not one of the choices"
            approver_field.choices = [(me, me)]
        approver_field.initial = me
        deputy_field.choices = [("", "---------")] + [(p, p) for p in people]


class _StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("current", "In force or to come"),
            (IN_FORCE, "In force"),
            (UPCOMING, "To come"),
            ("ended", "Ended"),
            ("revoked", "Revoked"),
            ("all", "All"),
        ]

    def value(self) -> str:
        return str(super().value() or "current")

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value == "all" else queryset.filter(in_state(value))

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


@admin.register(Delegation)
class DelegationAdmin(ReadOnlyAdmin):
    # Few columns, so the list fits beside the admin's menus and filter at 1400 px: the note
    # is under who, who recorded it under the state.
    list_display = ("who", "window", "scope", "state_shown")
    list_display_links = None
    list_filter = (_StateFilter,)
    search_fields = ("approver", "deputy")
    actions = ["revoke_selected"]
    ordering = ("-starts_at", "-id")

    class Media:
        css = CSS

    # -- who may --------------------------------------------------------------------------

    def has_module_permission(self, request: HttpRequest) -> bool:
        return allows(request, "delegations")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return allows(request, "delegations")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return allows(request, "delegations")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # never edited: revoked, and another one recorded

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the record of who decided for whom stays

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return allows(request, "delegations")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = with_state(super().get_queryset(request))
        if allows(request, "delegate"):
            return rows
        me = request.user.get_username()
        return rows.filter(Q(approver=me) | Q(deputy=me))

    def _may_end(self, request: HttpRequest, obj: Any) -> bool:
        me = request.user.get_username()
        return obj.state in (IN_FORCE, UPCOMING) and (
            me in (obj.approver, obj.deputy) or allows(request, "delegate")
        )

    # -- the list ---------------------------------------------------------------------------

    def get_list_display(self, request: HttpRequest) -> Any:
        return (*self.list_display, self._end_column(request))

    @admin.display(description="who", ordering="approver")
    def who(self, obj: Delegation) -> str:
        return format_html(
            "<strong>{}</strong> decides for <strong>{}</strong>{}",
            obj.deputy,
            obj.approver,
            format_html('<div class="da-cell-line">{}</div>', obj.note) if obj.note else "",
        )

    @admin.display(description="from, until", ordering="starts_at")
    def window(self, obj: Delegation) -> str:
        return format_html(
            '{}<div class="da-cell-line">until {}</div>',
            short_time(obj.starts_at),
            short_time(obj.ends_at),
        )

    @admin.display(description="calls")
    def scope(self, obj: Delegation) -> str:
        parts = []
        if obj.groups:
            parts.append("groups " + ", ".join(obj.groups))
        if obj.tools:
            parts.append("tools " + ", ".join(obj.tools))
        return "; ".join(parts) or "every call"

    @admin.display(description="state")
    def state_shown(self, obj: Any) -> str:
        """The state; under it, when it was revoked and by whom, and who recorded it."""
        words = {IN_FORCE: "in force", UPCOMING: "to come", "ended": "ended"}
        revoked = (
            format_html(
                '<div class="da-cell-line">{} by {}</div>',
                short_time(obj.revoked_at),
                obj.revoked_by,
            )
            if obj.revoked_at is not None
            else ""
        )
        return format_html(
            '{}{}<div class="da-cell-line">recorded {} by {}</div>',
            "revoked" if obj.revoked_at is not None else words.get(obj.state, str(obj.state)),
            revoked,
            short_time(obj.created_at),
            obj.created_by,
        )

    def _end_column(self, request: HttpRequest) -> Any:
        """The column of "End now…" links, for the rows this person may end."""

        @admin.display(description="")
        def end(obj: Any) -> str:
            if not self._may_end(request, obj):
                return ""
            return format_html(
                '<a class="button" href="{}">End now…</a>', admin_url(self, "revoke", obj.pk)
            )

        return end

    @admin.action(description="End (revoke) selected delegations", permissions=["revoke"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, refused = 0, []
        by = admin_actor(request)
        for obj in queryset:
            try:
                revoke(obj.pk, by)
                done += 1
            except DurableAgentsError as exc:
                refused.append(f"#{obj.pk}: {exc} [{exc.code}]")
        self.message_user(request, f"Ended {done} delegation(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.ERROR)

    # -- recording and ending ---------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [self.command_path("revoke", revoke_view), *super().get_urls()]

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = DelegationForm(request.POST or None, request=request)
        error = ""
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                made = delegate(
                    data["approver"],
                    data["deputy"],
                    data["starts_at"],
                    data["ends_at"],
                    _names(data["groups"]),
                    _names(data["tools"]),
                    by=admin_actor(request),
                    note=data["note"],
                )
            except DurableAgentsError as exc:
                error = f"{exc} [{exc.code}]"
            else:
                self.message_user(
                    request,
                    f"{made.deputy} decides for {made.approver} from "
                    f"{short_time(made.starts_at)} until {short_time(made.ends_at)}.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(admin_url(self, "changelist"))
        return page(
            self,
            request,
            "admin/durable_agents/delegation/add.html",
            "Record a delegation",
            {"form": form, "error": error},
        )


def revoke_view(admin_: DelegationAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """Confirm, then end one delegation now (a GET only shows what it would end)."""
    if not allows(request, "delegations"):
        raise PermissionDenied
    obj = admin_.get_queryset(request).filter(pk=object_id).first() if object_id.isdigit() else None
    if obj is None:
        messages.warning(request, f"There is no delegation #{object_id} you may see.")
        return HttpResponseRedirect(admin_url(admin_, "changelist"))
    error = ""
    if request.method == "POST":
        note = str(request.POST.get("note") or "")
        try:
            revoke(obj.pk, admin_actor(request), note)
        except DurableAgentsError as exc:
            error = f"{exc} [{exc.code}]"
        else:
            admin_.message_user(
                request,
                f"Ended: {obj.deputy} no longer decides for {obj.approver}.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(admin_url(admin_, "changelist"))
    return page(
        admin_,
        request,
        "admin/durable_agents/delegation/revoke.html",
        f"End the delegation: {obj.deputy} for {obj.approver}",
        {"obj": obj, "error": error, "may_end": admin_._may_end(request, obj)},
    )
