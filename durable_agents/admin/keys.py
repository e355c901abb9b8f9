"""API keys and approver keys in the admin: created, confirmed and revoked, never edited (a
key's meaning is its bytes). A new API key's raw value is shown once; only its hash is
stored. Registered when ``durable_agents.admin`` imports this module.

Keys belong to people. Staff create and register keys for themselves only, and see and
revoke only their own; a superuser may do so for anyone, and the key records who created it
(``created_by``, the action log and the object's admin history say so). A key created for
someone else is *pending* until its owner confirms it on its confirm page, signed in as
themselves (``durable_agents.people_keys``): an approver key by signing a fresh challenge with its
private key, an API key by generating it there, shown to the owner once. The confirm page
is open to the key's owner whatever their key permissions; to anyone else it is a form
error. A public key belongs to one user only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import ForeignKeyRawIdWidget
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .. import people_keys
from ..api.auth import API_KEY_HEADER
from ..engine.errors import ConfigError
from ..models import ApiKey, ApproverKey, KeyChallenge
from .base import (
    ADMIN,
    CSS,
    AnyModelAdmin,
    DurableAdmin,
    admin_actor,
    admin_url,
    page,
    short_time,
)

if TYPE_CHECKING:
    _KeyForm = forms.ModelForm[ApproverKey]
else:  # generic only in the type stubs
    _KeyForm = forms.ModelForm


class ApproverKeyForm(_KeyForm):
    class Meta:
        model = ApproverKey
        fields = ["user", "public_key"]
        help_texts = {"public_key": "The raw 32-byte Ed25519 public key, base64."}
        error_messages = {
            "public_key": {
                "unique": "This public key is already registered. A public key belongs to one "
                "user only, and a revoked key does not come back: generate a new key pair."
            }
        }

    def clean_public_key(self) -> str:
        try:
            return people_keys.clean_public_key(self.cleaned_data["public_key"])
        except ConfigError as exc:
            raise forms.ValidationError(exc.message) from None


def key_created(
    admin: AnyModelAdmin, request: HttpRequest, obj: Any, raw_key: str
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
            "header": API_KEY_HEADER,
            "changelist_url": admin_url(admin, "changelist"),
        },
        headers={"Cache-Control": "no-store"},
    )


def _state(key: ApiKey | ApproverKey) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if key.confirmed_at is None:
        return f"pending: {key.user.get_username()} confirms it"
    return "confirmed"


class _KeyAdmin(DurableAdmin):
    """Keys are created, confirmed and revoked, never edited: a key's meaning is its bytes.
    Each key belongs to one user: staff see, create and revoke their own; superusers
    anyone's. Only the owner confirms a key someone else created for them."""

    create_fields: list[str] = []
    actions = ["revoke"]
    confirm_template = ""

    class Media:
        css = CSS  # the lists' layout on a phone (admin.css)

    @admin.display(description="state")
    def state(self, obj: Any) -> str:
        """Pending, confirmed or revoked; a revoked key says when."""
        if obj.revoked_at is None:
            return _state(obj)
        return format_html(
            '{}<div class="da-cell-line">{}</div>', _state(obj), short_time(obj.revoked_at)
        )

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Any) -> str:
        """When, and by whom when someone created the key for its owner."""
        by = obj.created_by.get_username() if obj.created_by is not None else ""
        return format_html(
            "{}{}",
            short_time(obj.created_at),
            format_html('<div class="da-cell-line">by {}</div>', by) if by else "",
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request)
        if request.user.is_superuser:
            return rows
        return rows.filter(user=request.user.pk)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            kwargs["initial"] = request.user.pk
            if request.user.is_superuser:
                kwargs["widget"] = ForeignKeyRawIdWidget(db_field.remote_field, self.admin_site)
            else:
                # Anyone else may pick only themselves: a posted id of another user is a form
                # error ("Select a valid choice"), and nothing is created.
                me: Any = request.user.pk
                kwargs["queryset"] = get_user_model()._default_manager.filter(pk=me)
                kwargs["empty_label"] = None
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.create_fields if obj is None else super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return [f.name for f in self.model._meta.fields if f.name != "id"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            raise PermissionDenied  # nothing on a key is editable
        if obj.user_id != request.user.pk and not request.user.is_superuser:
            raise PermissionDenied  # the form allows only oneself; never trust it alone
        # The add view's transaction holds the key and its action-log row together.
        request._da_new_api_key = people_keys.settle_new_key(obj, request.user)  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)
        people_keys.log_key(admin_actor(request), people_keys.CREATE, obj)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        owner = obj.user.get_username()
        creator = request.user.get_username()
        said = f"Created for {owner}" + (f" by {creator}" if owner != creator else "")
        if obj.confirmed_at is None:
            said += f"; pending until {owner} confirms it"
        return super().log_addition(request, obj, said)

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        if obj.confirmed_at is not None:
            return super().response_add(request, obj, post_url_continue)
        owner = obj.user.get_username()
        url = request.build_absolute_uri(admin_url(self, "confirm", obj.pk))
        self.message_user(
            request,
            format_html(
                "{} created for {}. It is pending: it takes effect only when {}, signed in as "
                "themselves, confirms it at <a href='{}'>{}</a>. Send them that link.",
                obj,
                owner,
                owner,
                url,
                url,
            ),
            messages.WARNING,
        )
        return HttpResponseRedirect(admin_url(self, "changelist"))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # nothing on a key is editable; revoke it instead
        extra = {
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "GET":
            self._note_pending(request)
        return super().changelist_view(request, extra_context)

    def _note_pending(self, request: HttpRequest) -> None:
        mine = self.model._default_manager.filter(
            user=request.user.pk, confirmed_at__isnull=True, revoked_at__isnull=True
        ).select_related("created_by")
        links = format_html_join(
            ", ",
            "<a href='{}'>confirm {}</a> (created by {})",
            ((admin_url(self, "confirm", k.pk), k, k.created_by or "someone") for k in mine[:20]),
        )
        if links:
            self.message_user(
                request,
                format_html(
                    "Keys created for you wait for you to confirm them: {}. Until then they "
                    "do nothing.",
                    links,
                ),
                messages.WARNING,
            )

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        confirm = self.admin_site.admin_view(self.confirm_view)
        name = f"{opts.app_label}_{opts.model_name}_confirm"
        return [path("<int:object_id>/confirm/", confirm, name=name), *super().get_urls()]

    def _key(self, object_id: int) -> Any:
        # Not limited to keys the user may list: the owner confirms without any key
        # permission, and everyone else is refused by the confirm command itself.
        key = (
            self.model._default_manager.select_related("user", "created_by")
            .filter(pk=object_id)
            .first()
        )
        if key is None:
            raise Http404("no such key")
        return key

    def confirm_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        raise NotImplementedError

    def confirm_page(
        self, request: HttpRequest, key: Any, context: dict[str, Any], status: int = 200
    ) -> TemplateResponse:
        response = page(
            self,
            request,
            self.confirm_template,
            f"Confirm {key}",
            {"key": key, "state": _state(key), **context},
            status=status,
        )
        response.headers["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # get_queryset already limits staff to their own keys; revoking takes effect on the
        # next request (keys are checked on every request, never cached).
        live = list(queryset.filter(revoked_at__isnull=True).select_related("user"))
        done = people_keys.revoke_keys(live, request.user, channel=ADMIN)
        for key in live:
            if key.revoked_at is not None:
                self.log_change(request, key, "Revoked")
        self.message_user(request, f"Revoked {done} key(s).", messages.SUCCESS)


def _refusal(exc: ConfigError) -> str:
    return exc.message[:1].upper() + exc.message[1:]


@admin.register(ApiKey)
class ApiKeyAdmin(_KeyAdmin):
    # Few columns, so the list fits beside the admin's menus and filters at 1400 px: when a
    # key was revoked is under its state, who created it under when.
    list_display = ("name", "user", "state", "prefix", "created", "expires", "last_used")
    list_filter = (
        ("confirmed_at", admin.EmptyFieldListFilter),
        ("revoked_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("name", "prefix")
    list_select_related = ("user", "created_by")
    create_fields = ["user", "name", "expires_at"]
    confirm_template = "admin/durable_agents/apikey/confirm.html"

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: ApiKey) -> str:
        return short_time(obj.expires_at) if obj.expires_at else "never"

    @admin.display(description="last used", ordering="last_used_at")
    def last_used(self, obj: ApiKey) -> str:
        return short_time(obj.last_used_at) if obj.last_used_at else "never"

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        raw = getattr(request, "_da_new_api_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        return key_created(self, request, obj, raw)

    def confirm_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        key = self._key(object_id)
        error = ""
        if request.method == "POST":
            try:
                raw = people_keys.confirm_api_key(key, request.user, channel=ADMIN)
            except ConfigError as exc:
                error = _refusal(exc)
            else:
                return key_created(self, request, key, raw)
        elif key.user_id != request.user.pk:
            error = (
                f"Only {key.user.get_username()}, signed in as themselves, can confirm this key."
            )
        return self.confirm_page(
            request,
            key,
            {"error": error, "may_confirm": _may_confirm(key, request)},
        )


def _may_confirm(key: ApiKey | ApproverKey, request: HttpRequest) -> bool:
    return key.user_id == request.user.pk and key.confirmed_at is None and key.revoked_at is None


@admin.register(ApproverKey)
class ApproverKeyAdmin(_KeyAdmin):
    list_display = ("user", "approver_id", "key_preview", "state", "created")
    list_filter = (
        ("confirmed_at", admin.EmptyFieldListFilter),
        ("revoked_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("public_key",)
    list_select_related = ("user", "created_by")
    form = ApproverKeyForm
    create_fields = ["user", "public_key"]
    confirm_template = "admin/durable_agents/approverkey/confirm.html"

    @admin.display(description="approver id (signed)")
    def approver_id(self, obj: ApproverKey) -> str:
        return str(obj.user_id)

    @admin.display(description="public key")
    def key_preview(self, obj: ApproverKey) -> str:
        return f"{obj.public_key[:12]}…"

    def confirm_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        key = self._key(object_id)
        error = ""
        nonce = ""
        if request.method == "POST":
            nonce = str(request.POST.get("nonce") or "")
            signature = str(request.POST.get("signature") or "")
            try:
                people_keys.confirm_approver_key(key, request.user, nonce, signature, channel=ADMIN)
            except ConfigError as exc:
                error = _refusal(exc)
            else:
                self.message_user(
                    request,
                    f"{key} is confirmed: decisions signed with it count as yours.",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(admin_url(self, "confirm", key.pk))
        elif key.user_id != request.user.pk:
            error = (
                f"Only {key.user.get_username()}, signed in as themselves, can confirm this key."
            )
        challenge = None
        if _may_confirm(key, request):
            challenge = _usable_challenge(key, request, nonce) or people_keys.issue_challenge(
                key, request.user
            )
        return self.confirm_page(
            request,
            key,
            {
                "error": error,
                "may_confirm": challenge is not None,
                "challenge": challenge,
                "challenge_text": people_keys.challenge_text(challenge) if challenge else "",
            },
        )


def _usable_challenge(key: ApproverKey, request: HttpRequest, nonce: str) -> KeyChallenge | None:
    """The challenge a failed attempt posted, shown again while it can still be used (a
    mistyped signature need not cost a new challenge)."""
    if not nonce:
        return None
    return (
        KeyChallenge.objects.select_related("key")
        .filter(
            nonce=nonce,
            key=key,
            user=request.user.pk,
            used_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .first()
    )
