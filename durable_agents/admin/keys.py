"""API keys and approver keys in the admin: created and revoked, never edited (a key's
meaning is its bytes). A new API key's raw value is shown once; only its hash is stored.
Registered when ``durable_agents.admin`` imports this module.

Keys belong to people. Staff create and register keys for themselves only, and see and
revoke only their own; a superuser may do so for anyone, and the key records who created it
(``created_by``, and the object's admin history says so). A public key belongs to one user
only."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import ForeignKeyRawIdWidget
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..api.auth import API_KEY_HEADER, new_key
from ..models import ApiKey, ApproverKey
from .base import AnyModelAdmin, DurableAdmin, admin_url

if TYPE_CHECKING:
    _KeyForm = forms.ModelForm[ApproverKey]
else:  # generic only in the type stubs
    _KeyForm = forms.ModelForm


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
        return _clean_public_key(self.cleaned_data["public_key"])


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


class _KeyAdmin(DurableAdmin):
    """Keys are created and revoked, never edited: a key's meaning is its bytes. Each key
    belongs to one user: staff see, create and revoke their own; superusers anyone's."""

    create_fields: list[str] = []
    actions = ["revoke"]

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
        if not change:
            if obj.user_id != request.user.pk and not request.user.is_superuser:
                raise PermissionDenied  # the form allows only oneself; never trust it alone
            obj.created_by_id = request.user.pk
        super().save_model(request, obj, form, change)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        owner = obj.user.get_username()
        creator = request.user.get_username()
        said = f"Created for {owner}" + (f" by {creator}" if owner != creator else "")
        return super().log_addition(request, obj, said)

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

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # get_queryset already limits staff to their own keys; revoking takes effect on the
        # next request (keys are checked on every request, never cached).
        keys = list(queryset.filter(revoked_at__isnull=True))
        self.model._default_manager.filter(pk__in=[k.pk for k in keys]).update(revoked_at=Now())
        for key in keys:
            self.log_change(request, key, "Revoked")
        self.message_user(request, f"Revoked {len(keys)} key(s).", messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(_KeyAdmin):
    list_display = (
        "name",
        "user",
        "prefix",
        "created_by",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "prefix")
    list_select_related = ("user", "created_by")
    create_fields = ["user", "name", "expires_at"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if not change:
            raw, obj.prefix, obj.key_hash = new_key()
            request._da_new_api_key = raw  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        raw = getattr(request, "_da_new_api_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        return key_created(self, request, obj, raw)


@admin.register(ApproverKey)
class ApproverKeyAdmin(_KeyAdmin):
    list_display = ("user", "approver_id", "key_preview", "created_by", "created_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("public_key",)
    list_select_related = ("user", "created_by")
    form = ApproverKeyForm
    create_fields = ["user", "public_key"]

    @admin.display(description="approver id (signed)")
    def approver_id(self, obj: ApproverKey) -> str:
        return str(obj.user_id)

    @admin.display(description="public key")
    def key_preview(self, obj: ApproverKey) -> str:
        return f"{obj.public_key[:12]}…"
