"""Who acts: every command's ``by=`` resolves to one ``Actor``, by one rule.

``by`` may be a user object, a username, or an ``Actor`` the glue already resolved (with
the channel the request came through). The resolver is a port the host configures
(``runtime.configure(resolve_actor=...)``): the Django app resolves against the user model
(``durable_agents.people``); without one, a plain name stands for a trusted caller that
holds every permission (plain-Python use and tests on the in-memory store).

Whatever the path (admin, API key, session, signature, management command, Python), a
command then asks the same questions of the same ``Actor``: does it name one user, is that
user active, does it hold the command's permission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import runtime
from .errors import ActorError, ActorForbidden, ActorInactive, ConfigError
from .ports import ActionInfo

# The permissions the engine's commands need (Django's "app_label.codename" form).
APPROVE_TOOLCALL = "durable_agents.approve_toolcall"
RESOLVE_HALT = "durable_agents.resolve_halt"
OPERATE_RUNS = "durable_agents.cancel_run"
FORK_RUN = "durable_agents.fork_run"
# Record that a deputy decides for another approver (``engine.delegation``): anyone may for
# themselves; for someone else it takes this.
DELEGATE_APPROVALS = "durable_agents.delegate_approvals"

# How a request reached a command, recorded with every history row.
PYTHON = "python"


@dataclass(frozen=True)
class Actor:
    """One resolved user, and how their request arrived.

    ``id`` is the user's stable identity (the primary key, as text): it survives a rename,
    so signatures bind it. ``username`` is what history rows and the journal show.
    ``permissions`` None means unrestricted (no user system is configured)."""

    id: str
    username: str
    active: bool = True
    superuser: bool = False
    permissions: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    channel: str = PYTHON

    def has(self, permission: str) -> bool:
        if not self.active:
            return False
        return self.superuser or self.permissions is None or permission in self.permissions

    def via(self, channel: str) -> Actor:
        return replace(self, channel=channel)


def plain_actor(by: Any) -> Actor | None:
    """The resolver used when the host configured none: a name is a trusted caller."""
    name = by if isinstance(by, str) else getattr(by, "get_username", lambda: None)()
    if not isinstance(name, str) or not name:
        return None
    return Actor(id=name, username=name)


def resolve(by: Any, *, channel: str | None = None) -> Actor:
    """The one active user ``by`` names (``ActorError`` otherwise); ``channel`` says how the
    request came when ``by`` is not already an ``Actor`` that knows it."""
    if isinstance(by, Actor):
        actor: Actor | None = by
    elif by is None or by == "":
        raise ActorError(
            "this command needs to know who acts: pass by= a user object or a username"
        )
    else:
        resolver = runtime.actor_resolver() or plain_actor
        actor = resolver(by)
        if actor is not None and not isinstance(actor, Actor):
            raise ConfigError(
                f"the configured resolve_actor returned {type(actor).__name__}, not an Actor",
                code="config.runtime",
            )
    if actor is None:
        raise ActorError(
            f"by={_shown(by)} names no user; pass a user object or the username of an active user"
        )
    if channel is not None and (not isinstance(by, Actor) or actor.channel == PYTHON):
        actor = actor.via(channel)
    if not actor.active:
        raise ActorInactive(
            f"user {actor.username!r} is inactive; an inactive user cannot act (reactivate "
            "the account, or act as someone else)"
        )
    return actor


def require(actor: Actor, permission: str, what: str) -> None:
    """Refuse (``actor.forbidden``) unless ``actor`` holds ``permission``."""
    if not actor.has(permission):
        raise ActorForbidden(
            f"{actor.username!r} may not {what}: it needs the {permission!r} permission "
            "(grant it in the admin, directly or through a group)",
            permission=permission,
        )


def logged(
    actor: Actor,
    action: str,
    run_id: str,
    target: str = "",
    payload: Mapping[str, Any] | None = None,
) -> ActionInfo:
    """The history row for ``actor`` doing ``action``: who (name and stable id) and how."""
    return ActionInfo(
        actor.username,
        action,
        run_id,
        target,
        dict(payload or {}),
        actor_id=actor.id,
        channel=actor.channel,
    )


def _shown(by: Any) -> str:
    text = repr(by)
    return text if len(text) <= 80 else text[:77] + "..."
