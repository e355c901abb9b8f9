"""The audit chains on the site's database (docs/audit.md): verification, and the SQL
function SQLite's journal trigger calls.

The chain's definition and the verifier are the engine's (``engine/audit.py``); the hash of
a journal record is computed by the database in the statement that inserts it (migration
``0007_audit_chain``).

An imported run's records were hashed by whoever wrote the file: its chain holding together
proves nothing. It counts as verified only when the file carried a head signature by a key
this site trusts (``TRUSTED_AUDIT_KEYS``, or the site's own ``AUDIT_SIGNING_KEY``) over
the records it imported (``import_trust``); this site never signs such a head as its own.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import receiver

from ..conf import get_settings
from ..engine.approvals import decision_bytes
from ..engine.audit import (
    BUNDLE_FORMAT,
    ChainReport,
    action_content,
    chain_hash,
    data_digest,
    head_message,
    verify_actions,
    verify_links,
    verify_run,
)
from ..engine.errors import ConfigError, DurableAgentsError, NotFound
from ..engine.journal import Journal
from ..engine.names import RUN_START
from ..engine.registry import get_agent
from ..engine.sensitive import Redactor, derive_key
from ..models import (
    ActionLog,
    ApprovalRequest,
    Decision,
    Halt,
    JournalEntry,
    Run,
    RunImport,
    Tombstone,
)
from ..people import approver_keys
from .factory import store_for
from .store import DjangoStore
from .tombstones import (
    latest_unheld,
    prune_marks,
    pruned_reports,
    tombstone_report,
    unheld_report,
)

__all__ = [
    "ImportTrust",
    "bundle",
    "import_trust",
    "redactor",
    "sample_check",
    "sign_head",
    "tombstone_report",
    "trusted_keys",
    "verify",
]

# What ``verify`` says of an imported run whose chain no trusted signed head vouches for.
UNTRUSTED_IMPORT = "imported; no trusted signed head"


@receiver(connection_created, dispatch_uid="durable_agents.database.audit.sqlite")
def _register_sqlite_hash(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function(
            "durable_agents_chain_hash", 3, _sqlite_hash, deterministic=True
        )


def _sqlite_hash(prev: str | None, name: str, data: str) -> str:
    return chain_hash(prev, name, data)


def verify(
    run_ids: Iterable[str] | None = None, *, actions: bool = False, using: str | None = None
) -> list[ChainReport]:
    """Verify the chains of ``run_ids`` (every run when None), and the site's action log
    when ``actions``; one report each, in that order. A run id no run holds is reported by
    its last tombstone, or, when a prune row names it and no tombstone does, as broken
    (``tombstones``); ``NotFound`` when nothing knows it."""
    store = store_for(using)
    runs = Run.objects.using(store.using)
    stones = Tombstone.objects.using(store.using)
    if run_ids is None:
        reports = [
            _vouched(verify_run(store, run_id), store.using)
            for run_id in runs.order_by("run_id").values_list("pk", flat=True).iterator()
        ]
        reports += pruned_reports(store.using)
    else:
        run_ids = list(run_ids)
        here = set(runs.filter(pk__in=run_ids).values_list("pk", flat=True))
        gone = set(run_ids) - here
        found = {}
        for stone in stones.filter(run_id__in=gone).order_by("id"):
            found[stone.run_id] = stone
        marks = prune_marks(store.using, gone)
        missing = sorted(gone - set(found) - set(marks))
        if missing:
            raise NotFound(f"no run {', '.join(map(repr, missing))}", code="run.not_found")
        reports = [
            _vouched(verify_run(store, run_id), store.using)
            if run_id in here
            else tombstone_report(found[run_id], marks.get(run_id, []))
            if run_id in found
            else unheld_report(run_id, marks[run_id][-1])
            for run_id in run_ids
        ]
    if actions:
        reports.append(verify_actions(store))
    return reports


def sample_check(size: int, *, using: str | None = None) -> list[ChainReport]:
    """The broken chains among the ``size`` most recently updated runs (the system check;
    an imported run no trusted head vouches for is not broken, only unverified), the
    broken ones among the ``size`` latest tombstones, and the runs the latest prune rows
    name that no tombstone holds."""
    using = using or _database()
    runs = Run.objects.using(using).order_by("-updated_at")
    broken = [
        r
        for r in verify(list(runs.values_list("pk", flat=True)[:size]), using=using)
        if not r.intact
    ]
    # The latest tombstones too: a pruned run is verified by its tombstone, not missing.
    stones = list(Tombstone.objects.using(using).order_by("-pruned_at", "-id")[:size])
    marks = prune_marks(using, {s.run_id for s in stones})
    broken += [
        r for r in (tombstone_report(s, marks.get(s.run_id, [])) for s in stones) if not r.intact
    ]
    return broken + latest_unheld(using, size)


@dataclass(frozen=True)
class ImportTrust:
    """Whether an imported run's chain is vouched for: ``trusted`` when the file's head
    signature verifies, under a key this site trusts, over the head of the records it
    imported, and those records are still the first of its chain here; else ``why`` not."""

    trusted: bool
    why: str
    live: bool
    head: str | None  # the head the file stated, and how many records led to it
    records: int
    signature: str | None
    public_key: str | None


def trusted_keys() -> set[str]:
    """The public keys (base64) whose signed heads vouch for an imported run: the setting
    ``TRUSTED_AUDIT_KEYS``, and the site's own signing key."""
    settings = get_settings()
    keys = set(settings.trusted_audit_keys)
    if settings.audit_signing_key:
        keys.add(_public(_load_key(settings.audit_signing_key)))
    return keys


def import_trust(run_id: str, *, using: str | None = None) -> ImportTrust | None:
    """None for a run made here; else whether its imported chain is vouched for."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    using = using or _database()
    found = RunImport.objects.using(using).filter(run_id=run_id).first()
    if found is None:
        return None

    def trust(trusted: bool, why: str = "") -> ImportTrust:
        return ImportTrust(
            trusted, why, found.live, found.head, found.records, found.head_signature,
            found.public_key,
        )  # fmt: skip

    if not found.head_signature or not found.public_key or found.head is None:
        return trust(False, "the file carried no signed head")
    if found.public_key not in trusted_keys():
        return trust(
            False,
            f"its head is signed by key {found.public_key}, which this site does not trust "
            "(DURABLE_AGENTS['TRUSTED_AUDIT_KEYS'])",
        )
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(found.public_key)).verify(
            base64.b64decode(found.head_signature),
            head_message(run_id, found.head, found.records),
        )
    except (InvalidSignature, ValueError, TypeError):
        return trust(False, "the head signature does not verify for this run, head and count")
    hashes = (
        JournalEntry.objects.using(using)
        .filter(run_id=run_id)
        .order_by("seq")
        .values_list("hash", flat=True)
    )
    last = hashes[found.records - 1 : found.records] if found.records > 0 else []
    if [h for h in last] != [found.head]:
        return trust(False, "the records here do not lead to the signed head")
    return trust(True)


def _vouched(report: ChainReport, using: str) -> ChainReport:
    """``report``, marked unverified when its run is an import no trusted head vouches for."""
    if not report.intact:
        return report
    trust = import_trust(report.chain, using=using)
    if trust is None or trust.trusted:
        return report
    return replace(report, unverified=UNTRUSTED_IMPORT)


def _database() -> str:
    return get_settings().database


def redactor(run_id: str, *, using: str | None = None) -> Redactor:
    """The redactor of run ``run_id``'s exports: the sensitive fields of its agent's tools
    (as defined today; an agent this process does not load has none), the values they took
    in the run, and the key derived from ``AUDIT_SALT_KEY`` (else ``SECRET_KEY``)."""
    from django.conf import settings

    using = using or _database()
    agent_name = Run.objects.using(using).filter(pk=run_id).values_list("agent", flat=True).first()
    sensitive: dict[str, tuple[str, ...]] = {}
    if agent_name:
        try:
            tools = get_agent(agent_name).tools
        except DurableAgentsError:
            tools = {}
        sensitive = {name: t.sensitive for name, t in tools.items() if t.sensitive}
    secret = get_settings().audit_salt_key or settings.SECRET_KEY
    found = Redactor(derive_key(secret), run_id, sensitive)
    if not sensitive:
        return found
    for data in (
        JournalEntry.objects.using(using).filter(run_id=run_id).values_list("data", flat=True)
    ):
        found.collect_record(data)
    for r in ApprovalRequest.objects.using(using).filter(run_id=run_id):
        for args in (r.arguments, r.previous_arguments):
            found.collect_call(r.tool_name, args)
    for d in Decision.objects.using(using).filter(request__run_id=run_id).select_related("request"):
        found.collect_call(d.request.tool_name, d.arguments)
    for h in Halt.objects.using(using).filter(run_id=run_id):
        found.collect_call(h.tool_name, h.arguments)
    return found


@lru_cache(maxsize=4)
def _load_key(pem: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"DURABLE_AGENTS['AUDIT_SIGNING_KEY'] is not a readable PEM private key: {exc}",
            code="config.audit_key",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            "DURABLE_AGENTS['AUDIT_SIGNING_KEY'] must be an Ed25519 private key (PKCS#8 PEM)",
            code="config.audit_key",
        )
    return key


def _public(key: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def sign_head(run_id: str, *, using: str | None = None) -> dict[str, Any]:
    """The run's chain head, and when ``AUDIT_SIGNING_KEY`` is set, the site's Ed25519
    signature over ``head_message`` with the public key to check it (base64).

    An imported run no trusted head vouches for is never signed with the site's key: its
    head carries the file's own signature (when the chain still ends at the head it
    signed), and ``imported`` says so."""
    store = store_for(using)
    report = verify_links(run_id, store.chain(run_id))
    message = head_message(run_id, report.head, report.links)
    signed: dict[str, Any] = {
        "run_id": run_id,
        "head": report.head,
        "records": report.links,
        "message": message.decode("utf-8"),
        "signature": None,
        "public_key": None,
    }
    trust = import_trust(run_id, using=store.using)
    if trust is not None and not trust.trusted:
        signed["imported"] = {"trusted": False, "why": trust.why}
        if trust.head == report.head and trust.records == report.links:
            signed.update(signature=trust.signature, public_key=trust.public_key)
        return signed
    pem = get_settings().audit_signing_key
    if pem:
        key = _load_key(pem)
        signed["signature"] = base64.b64encode(key.sign(message)).decode()
        signed["public_key"] = _public(key)
    return signed


def bundle(run_id: str, *, using: str | None = None) -> dict[str, Any]:
    """One run's audit bundle (docs/audit.md): its journal with hashes, its signed head, its
    decisions with their signatures and the bytes they sign, its action-log rows with the
    hash before each, and the site's action-log head. ``NotFound`` for an unknown run.

    An imported run's bundle says so (``imported``: who imported which file, live or inert,
    whether a trusted signed head vouches for its chain, and the action-log rows the file
    carried); its head is signed by this site only when that head is trusted."""
    store = store_for(using)
    if not Run.objects.using(store.using).filter(pk=run_id).exists():
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    hide = redactor(run_id, using=store.using)
    records = _bundle_records(run_id, store.using, hide)
    decisions = _bundle_decisions(run_id, store, hide)
    actions = _bundle_actions(run_id, store.using, hide)
    return {
        "format": BUNDLE_FORMAT,
        "run_id": run_id,
        "redacted": hide.active,
        "records": records,
        "head": sign_head(run_id, using=store.using),
        "decisions": decisions,
        "actions": actions,
        "action_head": _action_head(store.using),
        "imported": _imported(run_id, store.using, hide),
    }


def _bundle_records(run_id: str, using: str, hide: Redactor) -> list[dict[str, Any]]:
    """The run's journal, each record with its hash and the digest of what it held."""
    entries = JournalEntry.objects.using(using).filter(run_id=run_id).order_by("seq")
    records = []
    for e in entries:
        shown = hide.redact_text(e.name, e.data)
        records.append(
            {"seq": e.seq, "name": e.name, "data": shown, "hash": e.hash,
             "digest": data_digest(e.data), "redacted": shown != e.data,
             "created_at": e.created_at.isoformat()}
        )  # fmt: skip
    return records


def _bundle_decisions(run_id: str, store: DjangoStore, hide: Redactor) -> list[dict[str, Any]]:
    """The run's decisions; a signed one with the bytes it signs and its approver's keys."""
    from django.contrib.auth import get_user_model

    start = Journal(store).get(run_id, RUN_START)
    incarnation = str(start.get("incarnation") or "") if start is not None else ""
    users = get_user_model()
    decisions = []
    rows = Decision.objects.using(store.using).filter(request__run_id=run_id)
    for d in rows.select_related("request").order_by("created_at", "id"):
        where = f"decision:{d.request.call_id}:{d.approver}"
        item: dict[str, Any] = {
            "call_id": d.request.call_id,
            "tool_name": d.request.tool_name,
            "arguments": hide.redact(where, d.request.arguments),
            "approver": d.approver,
            "approved": d.approved,
            "note": hide.redact(where, d.note),
            "edited": hide.redact(where, d.arguments),
            "created_at": d.created_at.isoformat(),
            "signature": d.signature,
            "signed_bytes": None,
            "approver_keys": [],
        }
        user = users._default_manager.filter(**{users.USERNAME_FIELD: d.approver}).first()
        if d.signature and user is not None:
            signed = decision_bytes(
                incarnation=incarnation,
                run_id=run_id,
                call_id=d.request.call_id,
                tool_name=d.request.tool_name,
                arguments=d.request.arguments,
                approver_id=str(user.pk),
                approved=d.approved,
                note=d.note,
                edited=d.arguments,
            )
            item["signed_bytes"] = base64.b64encode(signed).decode()
            item["approver_keys"] = approver_keys(str(user.pk))
        decisions.append(item)
    return decisions


def _action_head(using: str) -> str | None:
    """The hash of the site's last action-log row."""
    return ActionLog.objects.using(using).order_by("-id").values_list("hash", flat=True).first()


def _bundle_actions(run_id: str, using: str, hide: Redactor) -> list[dict[str, Any]]:
    """The run's action-log rows, each with the hash of the row before it."""
    log = ActionLog.objects.using(using)
    before = log.order_by("-id").values_list("hash", flat=True)
    actions = []
    for a in log.filter(run_id=run_id).order_by("id"):
        fields = {
            "actor": a.actor,
            "actor_id": a.actor_id,
            "channel": a.channel,
            "action": a.action,
            "run_id": a.run_id,
            "target": a.target,
            "payload": a.payload,
        }
        content = action_content(fields)
        shown = hide.redact(f"action:{a.id}", fields)
        actions.append(
            {
                "id": a.id,
                **shown,
                "created_at": a.created_at.isoformat(),
                "hash": a.hash,
                "prev": before.filter(id__lt=a.id).first(),
                "digest": data_digest(content),
                "redacted": shown != fields,
            }
        )
    return actions


def _imported(run_id: str, using: str, hide: Redactor) -> dict[str, Any] | None:
    found = RunImport.objects.using(using).filter(run_id=run_id).first()
    trust = import_trust(run_id, using=using)
    if found is None or trust is None:
        return None
    return {
        "live": found.live,
        "imported_at": found.imported_at.isoformat(),
        "imported_by": found.imported_by,
        "file_digest": found.file_digest,
        "exported_at": found.exported_at,
        "library": found.library,
        "head": found.head,
        "records": found.records,
        "head_signature": found.head_signature,
        "public_key": found.public_key,
        "trusted": trust.trusted,
        "why": trust.why or None,
        "actions": [
            hide.redact(f"imported-action:{n}", row) for n, row in enumerate(found.actions or ())
        ],
    }
