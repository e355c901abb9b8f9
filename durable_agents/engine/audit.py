"""The audit hash chains (docs/audit.md): their definition and their verification.

Each journal record stores ``hash = sha256(prev ‖ 0x00 ‖ name ‖ 0x00 ‖ digest)`` as 64
lowercase hex digits, where ``prev`` is the previous record's hash of the same run (as
ASCII hex; empty for the first hashed record), ``name`` the record's name (UTF-8) and
``digest`` the *data digest*: ``sha256`` of its canonical JSON text as stored (UTF-8), as 64
hex digits. A redacted export carries the digest beside redacted data, so its chain still
verifies without the hidden values. The head of a run is its last record's hash.

The action log is one chain for the whole site, in id order, with the same function:
``hash = H(prev, "action", content)`` where ``content`` is the canonical JSON of the row's
``action``, ``actor``, ``actor_id``, ``channel``, ``payload``, ``run_id`` and ``target``.

Records written before the chain existed have no hash: they form the run's *unchained
prefix*, which verification counts and reports but cannot vouch for. A record without a
hash after a hashed one is a break.

Verification recomputes every hash from the previous stored one and stops at the first
record whose stored hash differs: that record was edited, or a record before it was
deleted, inserted or moved. Deleting the *last* records leaves a shorter valid chain; only
a head kept elsewhere (an export, a signed head) shows that.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .records import encode

_sha256 = hashlib.sha256

ACTION_NAME = "action"
ACTION_FIELDS = ("action", "actor", "actor_id", "channel", "payload", "run_id", "target")


def data_digest(data: str) -> str:
    """The data digest a link hashes: ``sha256`` of the record's stored text, in hex."""
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def link_hash(prev: str | None, name: str, digest: str) -> str:
    """The hash of one link from its data digest: ``sha256(prev ‖ 0x00 ‖ name ‖ 0x00 ‖
    digest)`` in hex."""
    # One buffer: ``prev`` and ``digest`` are ASCII hex, so their UTF-8 is their ASCII.
    return hashlib.sha256(f"{prev or ''}\x00{name}\x00{digest}".encode()).hexdigest()


def chain_hash(prev: str | None, name: str, data: str) -> str:
    """The hash of one link from its data: ``link_hash(prev, name, data_digest(data))``."""
    # Written out, two calls fewer: a driver hashes every record it writes. A test pins it
    # to the two functions above.
    digest = _sha256(data.encode()).hexdigest()
    return _sha256(f"{prev or ''}\x00{name}\x00{digest}".encode()).hexdigest()


def action_content(fields: Mapping[str, Any]) -> str:
    """The canonical text an action-log row is hashed over."""
    return encode({k: fields.get(k, "" if k != "payload" else {}) for k in ACTION_FIELDS})


def action_hash(prev: str | None, fields: Mapping[str, Any]) -> str:
    return chain_hash(prev, ACTION_NAME, action_content(fields))


class Link(NamedTuple):
    """One stored link: its position (journal seq or action id), name, hashed text, hash.
    ``digest`` stands in for ``data``'s digest when ``data`` was redacted (an export)."""

    position: int
    name: str
    data: str
    hash: str | None
    digest: str | None = None


@dataclass(frozen=True)
class ChainReport:
    """What verifying one chain found. ``ok`` when no link is broken."""

    chain: str  # a run id, or "action log"
    links: int
    unchained: int  # records before the first hashed one
    head: str | None
    broken_at: int | None = None  # the position of the first broken link
    broken_name: str | None = None
    reason: str = ""
    # Why a chain that holds together is still not vouched for: an imported run's records
    # were hashed by whoever wrote the file, so only a head signed by a trusted key vouches
    # for them (docs/audit.md, "Imported runs"). Empty: nothing to add.
    unverified: str = ""
    # A run ``prune`` deleted is reported by its tombstone (docs/retention.md): who pruned
    # it when, and how its tombstone is vouched for. Empty: the run's records are here.
    pruned: str = ""

    @property
    def intact(self) -> bool:
        """No link is broken (said of the stored links alone)."""
        return self.broken_at is None

    @property
    def ok(self) -> bool:
        """Intact, and vouched for."""
        return self.broken_at is None and not self.unverified

    def message(self) -> str:
        if not self.intact:
            return f"{self.chain}: broken at {self.broken_name!r} ({self.broken_at}): {self.reason}"
        prefix = f", unchained prefix of {self.unchained}" if self.unchained else ""
        state = f"unverified ({self.unverified})" if self.unverified else "ok"
        if self.pruned:
            state += f" ({self.pruned})"
        return f"{self.chain}: {state}, {self.links} record(s){prefix}, head {self.head or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "ok": self.ok,
            "records": self.links,
            "unchained": self.unchained,
            "head": self.head,
            "broken_at": self.broken_at,
            "broken_name": self.broken_name,
            "reason": self.reason,
            "unverified": self.unverified or None,
            "pruned": self.pruned or None,
        }


def verify_links(chain: str, links: Iterable[Link]) -> ChainReport:
    """Recompute a chain from its stored links (in order); report the first broken one."""
    prev: str | None = None
    count = unchained = 0
    for link in links:
        count += 1
        if link.hash is None:
            if prev is None:
                unchained += 1
                continue
            return ChainReport(
                chain, count, unchained, prev, link.position, link.name,
                "it has no hash, but records before it do: its hash was removed",
            )  # fmt: skip
        digest = link.digest if link.digest is not None else data_digest(link.data)
        expected = link_hash(prev, link.name, digest)
        if link.hash != expected:
            return ChainReport(
                chain, count, unchained, prev, link.position, link.name,
                "its hash does not follow from the record before it: this record was "
                "changed, or one before it was deleted, inserted or moved",
            )  # fmt: skip
        prev = link.hash
    return ChainReport(chain, count, unchained, prev)


@runtime_checkable
class ChainStore(Protocol):
    """What a store offers to verify its chains (all three stores do)."""

    def chain(self, run_id: str) -> Sequence[Link]:
        """The run's journal as stored links, in commit order."""

    def action_chain(self) -> Sequence[Link]:
        """The site's action log as stored links (``data`` is ``action_content``), in order."""


def verify_run(store: ChainStore, run_id: str) -> ChainReport:
    return verify_links(run_id, store.chain(run_id))


def verify_actions(store: ChainStore) -> ChainReport:
    return verify_links("action log", store.action_chain())


HEAD_DOMAIN = "durable_agents.head.v1\n"
TOMBSTONE_DOMAIN = "durable_agents.tombstone.v1\n"
BUNDLE_FORMAT = "durable_agents.audit_bundle.v1"


def head_message(run_id: str, head: str | None, records: int) -> bytes:
    """What a signed run head signs: the domain line, then the canonical JSON of the run id,
    its head and how many records lead to it."""
    body = encode({"head": head, "records": records, "run_id": run_id})
    return (HEAD_DOMAIN + body).encode("utf-8")


def tombstone_message(
    run_id: str,
    head: str | None,
    records: int,
    *,
    export_sha256: str,
    pruned_at: str,
    pruned_by: str,
) -> bytes:
    """What a pruned run's signed tombstone signs: its own domain line (a tombstone is never
    mistaken for a live head), then the canonical JSON of the run id, its final head, how
    many records led to it, the export file's sha256 ("" when none was written), when
    (ISO 8601) and by whom it was pruned."""
    body = encode(
        {
            "export_sha256": export_sha256,
            "head": head,
            "pruned_at": pruned_at,
            "pruned_by": pruned_by,
            "records": records,
            "run_id": run_id,
        }
    )
    return (TOMBSTONE_DOMAIN + body).encode("utf-8")
