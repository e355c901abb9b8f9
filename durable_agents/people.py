"""Who acts and who may decide: the Django side of identity (users, groups, permissions,
keys), plugged into the engine's ports by ``apps.py``.

``resolve_actor`` is the engine's resolver: a user object or a username becomes one
``Actor`` (the user's primary key as its stable id, username, active flag, permissions
through the auth backends, groups). ``actor_for`` is the same with the channel a request
came through, for glue that starts from a name (the management command).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet

from .engine import identity
from .engine.identity import Actor
from .models import ApproverKey

COMMAND = "command"


def actor_of(user: Any, channel: str) -> Actor:
    """The ``Actor`` for a user object already loaded (this request's user, say)."""
    active = bool(getattr(user, "is_active", False))
    permissions = getattr(user, "get_all_permissions", None)
    groups = getattr(user, "groups", None)
    return Actor(
        id=str(user.pk),
        username=user.get_username(),
        active=active,
        superuser=active and bool(getattr(user, "is_superuser", False)),
        permissions=frozenset(permissions()) if active and permissions else frozenset(),
        groups=frozenset(groups.values_list("name", flat=True)) if groups is not None else None,
        channel=channel,
    )


def resolve_actor(by: Any) -> Actor | None:
    """The engine's resolver: a user object (read again, so a user deactivated since counts
    as inactive) or a username (the user model's natural key) → ``Actor``; None when it
    names no user."""
    User = get_user_model()
    manager = User._default_manager
    try:
        if isinstance(by, Model):
            if not isinstance(by, User) or by.pk is None:
                return None
            user = manager.get(pk=by.pk)
        elif isinstance(by, str) and by and "\x00" not in by:
            user = manager.get_by_natural_key(by)
        else:
            return None
    except (User.DoesNotExist, ValidationError, ValueError):
        return None
    return actor_of(user, identity.PYTHON)


def actor_for(by: Any, channel: str = COMMAND) -> Actor:
    """``by`` (a user object or a username) as one active user acting through ``channel``;
    ``ConfigError`` (``actor.unknown`` / ``actor.inactive``) otherwise. The management
    command resolves ``--by`` with it."""
    return identity.resolve(by, channel=channel)


def eligible_approvers(group: str) -> list[str]:
    """Active members of ``group`` who hold the approve_toolcall permission (directly, through
    a group, or as superusers), by username."""
    return sorted(u.get_username() for u in approvers(group))


def approvers(group: str | None = None) -> QuerySet[Any]:
    """Active users who hold the approve_toolcall permission (directly, through a group, or
    as superusers); with ``group``, only its members. One query when evaluated."""
    User = get_user_model()
    members = User.objects.filter(is_active=True)
    if group is not None:
        members = members.filter(groups__name=group)
    # The permission the engine's eligibility rule asks for, as the Permission table names it.
    app_label, _, codename = identity.APPROVE_TOOLCALL.partition(".")
    perm = (
        Q(is_superuser=True)
        | Q(
            user_permissions__codename=codename,
            user_permissions__content_type__app_label=app_label,
        )
        | Q(
            groups__permissions__codename=codename,
            groups__permissions__content_type__app_label=app_label,
        )
    )
    return User.objects.filter(perm, pk__in=members.values("pk")).distinct()


def approver_keys(user_id: str) -> list[str]:
    """The Ed25519 public keys (base64) registered to the user ``user_id`` that verify
    signatures: revoked ones left out, and pending ones (registered by someone else, not yet
    confirmed by the user: ``durable_agents.keys``) too. Every path that checks a signed
    decision reads keys through this, so a pending key is refused as an unknown one."""
    try:
        rows = ApproverKey.objects.filter(
            user_id=user_id, revoked_at__isnull=True, confirmed_at__isnull=False
        )
        return list(rows.values_list("public_key", flat=True))
    except (ValidationError, ValueError):
        return []
