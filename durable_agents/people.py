"""Who may decide what: the Django side of approvals (users, groups, permissions, keys)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import Q

from .models import ApproverKey

APPROVE_PERMISSION = "durable_agents.approve_toolcall"


def eligible_approvers(group: str) -> list[str]:
    """Active members of ``group`` who hold the approve_toolcall permission (directly, through
    a group, or as superusers), by username."""
    User = get_user_model()
    members = User.objects.filter(is_active=True, groups__name=group).distinct()
    perm = (
        Q(is_superuser=True)
        | Q(
            user_permissions__codename="approve_toolcall",
            user_permissions__content_type__app_label="durable_agents",
        )
        | Q(
            groups__permissions__codename="approve_toolcall",
            groups__permissions__content_type__app_label="durable_agents",
        )
    )
    allowed = User.objects.filter(perm, pk__in=members.values("pk")).distinct()
    return sorted(u.get_username() for u in allowed)


def approver_keys(approver: str) -> list[str]:
    """The approver's registered Ed25519 public keys (base64), revoked ones left out."""
    return list(
        ApproverKey.objects.filter(approver=approver, revoked_at__isnull=True).values_list(
            "public_key", flat=True
        )
    )
