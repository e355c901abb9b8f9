"""Who acts and who may decide: the Django side of identity (users, groups, permissions,
keys), plugged into the engine's ports by ``apps.py``.

``resolve_actor`` is the engine's resolver: a user object or a username becomes one
``Actor`` (the user's primary key as its stable id, username, active flag, permissions
through the auth backends, groups). ``actor_for`` is the same with the channel a request
came through, for glue that starts from a name (the management command).

The people who act through the admin, the API (session or key) and the management command
are **active staff users**: ``staff_refusal`` is that one rule, asked by the API's auth and by
``actor_for`` (Django's admin asks ``is_staff`` itself). Python callers and the settings a
site deploys (``RETENTION["BY"]``) are the site's own code, trusted as such; an external
approver's *signed* decision comes through a staff relay, and the approver need not be staff.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Model, Q, QuerySet

from .engine import identity
from .engine.errors import ActorForbidden
from .engine.identity import Actor
from .models import ApproverKey

COMMAND = "command"


class ActorNotStaff(ActorForbidden):
    """A person acting through the admin, the API or the command who is not staff."""

    code = "auth.not_staff"


def staff_refusal(user: Any) -> str:
    """Why ``user`` may not act through the admin, the API or the command as staff ("" when
    it may): it must be a staff user (``is_staff``). Activity is checked on every path
    before this, each with its own code."""
    if getattr(user, "is_staff", False):
        return ""
    return (
        f"{user.get_username()!r} is not a staff user; the admin, the API and the management "
        "command act only as active staff users (set is_staff, or act as someone who is)"
    )


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
    """``by`` (a user object or a username) as one active staff user acting through
    ``channel``; ``ConfigError`` (``actor.unknown`` / ``actor.inactive`` /
    ``auth.not_staff``) otherwise. The management command resolves ``--by`` with it."""
    actor = identity.resolve(by, channel=channel)
    try:
        user = get_user_model()._default_manager.filter(pk=actor.id).first()
    except (ValueError, ValidationError):  # a resolver of the host's own, not a user's pk
        user = None
    refused = (
        staff_refusal(user) if user is not None else f"{actor.username!r} is no user of this site"
    )
    if refused:
        raise ActorNotStaff(refused)
    return actor


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
    confirmed by the user: ``durable_agents.people_keys``) too. Every path that checks a signed
    decision reads keys through this, so a pending key is refused as an unknown one."""
    try:
        rows = ApproverKey.objects.filter(
            user_id=user_id, revoked_at__isnull=True, confirmed_at__isnull=False
        )
        return list(rows.values_list("public_key", flat=True))
    except (ValidationError, ValueError):
        return []
