"""Keys belong to people, and a key registered for someone else takes effect only once its
owner confirms it, signed in as themselves.

* **Approver keys.** Registered by its owner, a key is confirmed at once. Registered by
  anyone else (a superuser), it is *pending*: it verifies no signature (``people.approver_keys``
  leaves it out, so every path that checks a signed decision refuses it exactly as an
  unknown key) until its owner, in their own session, signs a fresh challenge with its
  private key (``issue_challenge``, ``confirm_approver_key``): proof that the person the key
  names holds it. A challenge is random, bound to the key and the user it was shown to,
  single use, and expires after ``CHALLENGE_TTL``.
* **API keys.** Created by its owner, a key is generated and shown once, to them. Created for
  someone else, it is an *invitation* that holds no secret at all (empty prefix and hash:
  nothing can authenticate with it, and its creator never sees a usable value); the owner
  confirms it in their own session (``confirm_api_key``), which generates the raw key and
  shows it to them once.

Every creation, confirmation and revocation writes an action-log row (``create_key``,
``confirm_key``, ``revoke_key``; run id empty): the actor is who did it, the payload names the
key's owner. What this does not do: a superuser can still change another user's password
and sign in as them; Django's own admin history records that (docs/admin.md, "Limits").
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from .engine import identity
from .engine.errors import ConfigError
from .engine.identity import Actor
from .models import ApiKey, ApproverKey, KeyChallenge
from .people import actor_of

__all__ = [
    "CHALLENGE_DOMAIN",
    "CHALLENGE_TTL",
    "challenge_text",
    "confirm_api_key",
    "confirm_approver_key",
    "invite_api_key",
    "issue_api_key",
    "issue_challenge",
    "pending_for",
    "register_approver_key",
    "revoke_keys",
]

PREFIX_LENGTH = 8
CHALLENGE_TTL = timedelta(minutes=15)
# The first words of every challenge: a signature over one can never be taken for a signed
# decision (those begin ``durable_agents.approval.``) or a challenge of another format.
CHALLENGE_DOMAIN = "durable_agents.key-confirmation.v1"

CREATE, CONFIRM, REVOKE = "create_key", "confirm_key", "revoke_key"
APPROVER, API = "approver", "api"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh raw API key, its prefix and its hash."""
    raw = secrets.token_urlsafe(32)
    return raw, raw[:PREFIX_LENGTH], hash_key(raw)


def clean_public_key(value: str) -> str:
    """``value`` as the canonical base64 of a raw 32-byte Ed25519 public key;
    ``ConfigError`` (``key.invalid``) otherwise."""
    value = "".join(str(value).split())
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("The key is not valid base64.", code="key.invalid") from None
    if len(raw) != 32:
        raise ConfigError(
            f"An Ed25519 public key is exactly 32 bytes; this one is {len(raw)}.",
            code="key.invalid",
        )
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ConfigError(
            "These 32 bytes are not an Ed25519 public key.", code="key.invalid"
        ) from None
    return base64.b64encode(raw).decode()


# -- what a new key is --------------------------------------------------------------


def settle_new_key(key: ApiKey | ApproverKey, creator: Any) -> str | None:
    """Fill in an unsaved key's creator and state by the one rule: its owner's own key is
    confirmed at once (an API key gets its secret, returned raw), anyone else's is pending
    (an API key with no secret). The caller saves it, and logs it with ``log_key``."""
    key.created_by_id = creator.pk
    own = key.user_id == creator.pk
    key.confirmed_at = timezone.now() if own else None
    if not isinstance(key, ApiKey):
        return None
    if not own:
        key.prefix, key.key_hash = "", ""
        return None
    raw, key.prefix, key.key_hash = new_key()
    return raw


def log_key(actor: Actor, action: str, key: ApiKey | ApproverKey) -> None:
    """The action-log row for ``actor`` creating, confirming or revoking ``key``."""
    from .database.store import site_store

    kind = API if isinstance(key, ApiKey) else APPROVER
    payload: dict[str, Any] = {
        "key": kind,
        "key_id": key.pk,
        "owner": key.user.get_username(),
        "owner_id": str(key.user_id),
        "pending": key.confirmed_at is None,
    }
    if isinstance(key, ApiKey):
        payload.update(name=key.name, prefix=key.prefix)
    else:
        payload["public_key"] = key.public_key
    site_store().log_action(identity.logged(actor, action, "", f"{kind}-key:{key.pk}", payload))


def _atomic() -> contextlib.ExitStack:
    """One transaction over the keys (default database) and the action log (the site
    store's), so a key never changes without its row."""
    from .database.store import site_store

    stack = contextlib.ExitStack()
    stack.enter_context(transaction.atomic())
    using = site_store().using
    if using not in (None, DEFAULT_DB_ALIAS):
        stack.enter_context(transaction.atomic(using=using))
    return stack


# -- creating -----------------------------------------------------------------------


def register_approver_key(
    user: Any, public_key: str, *, by: Any, channel: str = identity.PYTHON
) -> ApproverKey:
    """Register ``public_key`` (raw Ed25519, base64) to ``user``, as ``by``. Confirmed at
    once when ``by`` is ``user``; pending otherwise, until ``user`` confirms it. Only the
    owner or a superuser may register (``key.forbidden``); a bad or taken key is
    ``key.invalid`` / ``key.taken``."""
    if by.pk != user.pk and not getattr(by, "is_superuser", False):
        raise ConfigError(
            f"{by.get_username()!r} may register keys for themselves only; a superuser may "
            "register one for someone else, who must then confirm it",
            code="key.forbidden",
        )
    key = ApproverKey(user=user, public_key=clean_public_key(public_key))
    settle_new_key(key, by)
    try:
        with _atomic():
            key.save()
            log_key(actor_of(by, channel), CREATE, key)
    except IntegrityError:
        raise ConfigError(
            "This public key is already registered; a public key belongs to one user only",
            code="key.taken",
        ) from None
    return key


def issue_api_key(
    user: Any,
    name: str,
    *,
    created_by: Any = None,
    expires_at: datetime | None = None,
    channel: str = identity.PYTHON,
) -> tuple[ApiKey, str]:
    """Create an API key for ``user``, by ``user``; return the row and the raw key, which is
    shown once and never stored. A key for someone else is an invitation with no secret:
    ``invite_api_key`` (``key.not_owner`` here)."""
    if created_by is not None and created_by.pk != user.pk:
        raise ConfigError(
            "an API key created for someone else holds no usable secret until its owner "
            "confirms it: use durable_agents.people_keys.invite_api_key",
            code="key.not_owner",
        )
    key = ApiKey(user=user, name=name, expires_at=expires_at)
    raw = settle_new_key(key, user)
    assert raw is not None  # an owner's own key always has its secret
    with _atomic():
        key.save()
        log_key(actor_of(user, channel), CREATE, key)
    return key, raw


def invite_api_key(
    user: Any,
    name: str,
    *,
    by: Any,
    expires_at: datetime | None = None,
    channel: str = identity.PYTHON,
) -> ApiKey:
    """A pending API key for ``user``, created by the superuser ``by``: no secret exists until
    ``user`` confirms it (``confirm_api_key``), and then only they see it."""
    if not getattr(by, "is_superuser", False) or by.pk == user.pk:
        raise ConfigError(
            "only a superuser invites an API key, and for someone else; create your own "
            "with issue_api_key",
            code="key.forbidden",
        )
    key = ApiKey(user=user, name=name, expires_at=expires_at)
    settle_new_key(key, by)
    with _atomic():
        key.save()
        log_key(actor_of(by, channel), CREATE, key)
    return key


# -- confirming ---------------------------------------------------------------------


def _check_pending(key: ApiKey | ApproverKey, user: Any) -> None:
    if key.user_id != user.pk:
        raise ConfigError(
            f"only {key.user.get_username()!r}, signed in as themselves, can confirm this key",
            code="key.not_owner",
        )
    if key.revoked_at is not None:
        raise ConfigError("this key was revoked; it cannot be confirmed", code="key.revoked")
    if key.confirmed_at is not None:
        raise ConfigError("this key is confirmed already", code="key.confirmed")


def challenge_text(challenge: KeyChallenge) -> str:
    """What the owner signs (its UTF-8 bytes): one line naming the user's id, the key and a
    random nonce, so a signature confirms this key for this user once."""
    return (
        f"{CHALLENGE_DOMAIN} user={challenge.user_id} "
        f"key={challenge.key.public_key} nonce={challenge.nonce}"
    )


def issue_challenge(key: ApproverKey, user: Any) -> KeyChallenge:
    """A fresh challenge for ``user`` to confirm their pending ``key`` (``key.not_owner``,
    ``key.revoked``, ``key.confirmed`` otherwise). The key's challenges long expired go (one
    recently expired stays, so its late use is told apart from a made-up one)."""
    _check_pending(key, user)
    now = timezone.now()
    KeyChallenge.objects.filter(key=key, expires_at__lte=now - CHALLENGE_TTL).delete()
    return KeyChallenge.objects.create(
        key=key, user=user, nonce=secrets.token_urlsafe(32), expires_at=now + CHALLENGE_TTL
    )


def _signature_verifies(public_key: str, signature: str, message: bytes) -> bool:
    try:
        sig = base64.b64decode("".join(signature.split()), validate=True)
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key)).verify(sig, message)
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True


def confirm_approver_key(
    key: ApproverKey, user: Any, nonce: str, signature: str, *, channel: str = identity.PYTHON
) -> None:
    """Confirm ``user``'s pending ``key``: ``signature`` (base64) must be the key's Ed25519
    signature of ``challenge_text`` of the unused, unexpired challenge ``nonce`` issued to
    ``user`` for this key. Refused with a ``ConfigError`` (``key.not_owner``,
    ``key.revoked``, ``key.confirmed``, ``challenge.unknown``, ``challenge.used``,
    ``challenge.expired``, ``key.bad_signature``), and then nothing changes."""
    _check_pending(key, user)
    challenge = (
        KeyChallenge.objects.select_related("key")
        .filter(nonce=str(nonce), key=key, user=user.pk)
        .first()
    )
    if challenge is None:
        raise ConfigError(
            "no such challenge for this key and you; reload the page for a fresh one",
            code="challenge.unknown",
        )
    if challenge.used_at is not None:
        raise ConfigError(
            "this challenge was used already; reload the page for a fresh one",
            code="challenge.used",
        )
    now = timezone.now()
    if challenge.expires_at <= now:
        raise ConfigError(
            "this challenge expired; reload the page for a fresh one and sign it",
            code="challenge.expired",
        )
    if not _signature_verifies(key.public_key, signature, challenge_text(challenge).encode()):
        raise ConfigError(
            "the signature does not verify: sign the challenge shown, exactly, with the private "
            "key of this public key (base64 of the 64-byte Ed25519 signature)",
            code="key.bad_signature",
        )
    with _atomic():
        # Conditional updates: two tabs racing on one challenge, or a revocation racing the
        # confirmation, leave exactly one outcome.
        used = KeyChallenge.objects.filter(pk=challenge.pk, used_at__isnull=True).update(
            used_at=now
        )
        confirmed = ApproverKey.objects.filter(
            pk=key.pk, user=user.pk, confirmed_at__isnull=True, revoked_at__isnull=True
        ).update(confirmed_at=now)
        if not (used and confirmed):
            transaction.set_rollback(True)
            raise ConfigError(
                "the key or its challenge changed meanwhile; reload the page",
                code="challenge.used",
            )
        key.confirmed_at = now
        log_key(actor_of(user, channel), CONFIRM, key)


def confirm_api_key(key: ApiKey, user: Any, *, channel: str = identity.PYTHON) -> str:
    """Confirm ``user``'s pending API key (an invitation): generate its secret now and
    return the raw key, for ``user``'s eyes once. Refused (``key.not_owner``,
    ``key.revoked``, ``key.confirmed``, ``key.expired``) with nothing changed."""
    _check_pending(key, user)
    now = timezone.now()
    if key.expires_at is not None and key.expires_at <= now:
        raise ConfigError("this key expired before it was confirmed", code="key.expired")
    raw, prefix, digest = new_key()
    with _atomic():
        done = ApiKey.objects.filter(
            pk=key.pk, user=user.pk, confirmed_at__isnull=True, revoked_at__isnull=True
        ).update(confirmed_at=now, prefix=prefix, key_hash=digest)
        if not done:
            raise ConfigError("the key changed meanwhile; reload the page", code="key.confirmed")
        key.confirmed_at, key.prefix, key.key_hash = now, prefix, digest
        log_key(actor_of(user, channel), CONFIRM, key)
    return raw


# -- revoking and listing -----------------------------------------------------------


def revoke_keys(keys: Iterable[ApiKey | ApproverKey], by: Any, *, channel: str) -> int:
    """Revoke the live ones among ``keys`` (pending or confirmed), as ``by``; one action-log
    row each. Returns how many were revoked."""
    actor = actor_of(by, channel)
    done = 0
    now = timezone.now()
    with _atomic():
        for key in keys:
            model = type(key)
            if model._default_manager.filter(pk=key.pk, revoked_at__isnull=True).update(
                revoked_at=now
            ):
                key.revoked_at = now
                log_key(actor, REVOKE, key)
                done += 1
    return done


def pending_for(user: Any) -> tuple[QuerySet[ApproverKey], QuerySet[ApiKey]]:
    """``user``'s keys that others created and that wait for them to confirm (not revoked)."""
    approver = ApproverKey.objects.filter(
        user=user.pk, confirmed_at__isnull=True, revoked_at__isnull=True
    ).select_related("created_by")
    api = ApiKey.objects.filter(
        user=user.pk, confirmed_at__isnull=True, revoked_at__isnull=True
    ).select_related("created_by")
    return approver, api
