"""What vouches for a pruned run's tombstone (docs/retention.md, "Verify").

A tombstone is a row anyone who can write the database can write, so two things vouch for
it, checked in this order:

1. **Its signature.** One that does not verify is broken (the row was changed). With
   ``AUDIT_SIGNING_KEY`` set, every tombstone must carry one by a key this site trusts: an
   unsigned tombstone is *unverified*, whenever it was written, since stripping the
   signature is the cheapest forgery there is.
2. **The prune row that wrote it.** Each batch's action-log row (``prune``) names every run
   it pruned with the head, record count and unchained prefix its tombstone states, when
   (``pruned_at``), by whom and into which export. A tombstone no prune row agrees with in
   every one of those is broken: no prune wrote it, or it was changed since. A run a prune
   row names that no tombstone holds is broken too: its tombstone was deleted.

The prune rows are part of the action log's hash chain, so ``verify --all`` also proves
they were not changed; but the chain is unkeyed, and whoever can write the database can
append a matching row at its end. Without a signing key the cross-check catches a careless
forgery, not a careful one (docs/retention.md, "Limits").
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Exists, OuterRef

from ..engine.audit import ChainReport, tombstone_message

__all__ = [
    "PruneMark",
    "latest_unheld",
    "prune_marks",
    "pruned_reports",
    "tombstone_report",
    "unheld_report",
]

PRUNE = "prune"  # the action of a prune's action-log row (``retention._prune_batch``)


@dataclass(frozen=True)
class PruneMark:
    """What one prune row of the action log says of one run it pruned: what its tombstone
    must state."""

    row: int  # the action-log row's id
    head: str | None
    records: int | None
    unchained: int | None
    pruned_at: str
    pruned_by: str
    pruned_by_id: str
    export_file: str
    export_sha256: str


def _marks(row: int, actor: str, actor_id: str, payload: Any) -> dict[str, PruneMark]:
    """The runs one prune row names (its ``tombstones``), each with what it says of its
    tombstone."""
    payload = payload if isinstance(payload, Mapping) else {}
    stated = payload.get("tombstones")
    export = payload.get("export")
    export = export if isinstance(export, Mapping) else {}
    out = {}
    for rid, chain in stated.items() if isinstance(stated, Mapping) else ():
        chain = chain if isinstance(chain, Mapping) else {}
        out[str(rid)] = PruneMark(
            row=row,
            head=chain.get("head"),
            records=chain.get("records"),
            unchained=chain.get("unchained"),
            pruned_at=str(payload.get("pruned_at") or ""),
            pruned_by=actor,
            pruned_by_id=actor_id,
            export_file=str(export.get("file") or ""),
            export_sha256=str(export.get("sha256") or ""),
        )
    return out


def _prune_rows(using: str, run_ids: Iterable[str] | None = None) -> Any:
    from ..models import ActionLog

    rows = ActionLog.objects.using(using).filter(action=PRUNE)
    if run_ids is not None and connections[using].vendor == "postgresql":
        # Only a narrowing (``prune_marks`` picks the runs out of each row): SQLite's JSON
        # path would take a numeric run id for an array index, so there every row is read.
        rows = rows.filter(payload__tombstones__has_any_keys=sorted(set(run_ids)))
    return rows.values_list("id", "actor", "actor_id", "payload")


def prune_marks(using: str, run_ids: Iterable[str]) -> dict[str, list[PruneMark]]:
    """What the prune rows naming ``run_ids`` say of them, oldest row first."""
    wanted = set(run_ids)
    found: dict[str, list[PruneMark]] = {}
    if not wanted:
        return found
    for row in _prune_rows(using, wanted).order_by("id"):
        for rid, mark in _marks(*row).items():
            if rid in wanted:
                found.setdefault(rid, []).append(mark)
    return found


def differences(stone: Any, mark: PruneMark) -> list[str]:
    """The fields in which ``stone`` says other than ``mark``; [] when they agree."""
    try:
        when: Any = datetime.fromisoformat(mark.pruned_at)
    except ValueError:
        when = None
    stated = {
        "head": (stone.head, mark.head),
        "records": (stone.records, mark.records),
        "unchained": (stone.unchained, mark.unchained),
        "pruned_at": (stone.pruned_at, when),
        "pruned_by": (stone.pruned_by, mark.pruned_by),
        "pruned_by_id": (stone.pruned_by_id, mark.pruned_by_id),
        "export_file": (stone.export_file, mark.export_file),
        "export_sha256": (stone.export_sha256, mark.export_sha256),
    }
    return [name for name, (mine, theirs) in stated.items() if mine != theirs]


def tombstone_report(stone: Any, marks: Sequence[PruneMark] | None = None) -> ChainReport:
    """A pruned run as its tombstone vouches for it: broken when its signature does not
    verify or no prune row agrees with it (``marks``: what the prune rows naming its run
    say, read here when None); unverified when it is unsigned while a signing key is set,
    or signed by a key this site does not trust; else verified."""
    report = _said(stone)
    problem = _signature_problem(stone)
    if problem:
        return _broken(report, stone, problem)
    if marks is None:
        marks = prune_marks(stone._state.db, [stone.run_id]).get(stone.run_id, [])
    if not marks:
        return _broken(
            report,
            stone,
            "no prune row of the action log names this run: prune did not write this tombstone",
        )
    agreeing = next((m for m in marks if not differences(stone, m)), None)
    if agreeing is None:
        nearest = min(marks, key=lambda m: len(differences(stone, m)))
        return _broken(
            report,
            stone,
            f"its tombstone differs from prune row {nearest.row} of the action log in "
            f"{', '.join(differences(stone, nearest))}: the tombstone was changed",
        )
    return _standing(report, stone, agreeing.row)


def _checked(stone: Any, row: int) -> ChainReport:
    """``tombstone_report`` of a tombstone prune row ``row`` is known to agree with."""
    report = _said(stone)
    problem = _signature_problem(stone)
    return _broken(report, stone, problem) if problem else _standing(report, stone, row)


def _said(stone: Any) -> ChainReport:
    said = f"pruned {stone.pruned_at.isoformat()} by {stone.pruned_by}"
    said += f", export sha256 {stone.export_sha256}" if stone.export_sha256 else ", no export"
    return ChainReport(stone.run_id, stone.records, stone.unchained, stone.head, pruned=said)


def _broken(report: ChainReport, stone: Any, reason: str) -> ChainReport:
    return replace(report, broken_at=stone.pk, broken_name="tombstone", reason=reason)


def _signature_problem(stone: Any) -> str:
    """Why the tombstone's signature does not verify ("" when it does, or it has none)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not stone.signature:
        return ""
    message = tombstone_message(
        stone.run_id, stone.head, stone.records, export_sha256=stone.export_sha256,
        pruned_at=stone.pruned_at.isoformat(), pruned_by=stone.pruned_by,
    )  # fmt: skip
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(stone.public_key or "")).verify(
            base64.b64decode(stone.signature), message
        )
    except (InvalidSignature, ValueError, TypeError):
        return "its tombstone's signature does not verify: the tombstone was changed"
    return ""


def _standing(report: ChainReport, stone: Any, row: int) -> ChainReport:
    """A tombstone whose signature (if any) verifies and which prune row ``row`` agrees
    with: verified, or unverified for want of a trusted signature."""
    from ..conf import get_settings
    from .audit import trusted_keys

    said = f"{report.pruned}, prune row {row}"
    if not stone.signature:
        if get_settings().audit_signing_key:
            return replace(
                report,
                pruned=said,
                unverified="unsigned tombstone, while AUDIT_SIGNING_KEY is set: every "
                "tombstone must be signed by a key this site trusts",
            )
        return replace(report, pruned=said + ", unsigned tombstone")
    if stone.public_key not in trusted_keys():
        return replace(
            report,
            pruned=said,
            unverified=f"tombstone signed by key {stone.public_key}, which this site does "
            "not trust",
        )
    return replace(report, pruned=said + ", signed tombstone")


def unheld_report(run_id: str, mark: PruneMark) -> ChainReport:
    """A run a prune row names that no tombstone holds."""
    return ChainReport(
        run_id,
        mark.records if isinstance(mark.records, int) else 0,
        mark.unchained if isinstance(mark.unchained, int) else 0,
        mark.head,
        broken_at=mark.row,
        broken_name="tombstone",
        reason=f"prune row {mark.row} of the action log says this run was pruned, but no "
        "tombstone holds it: its tombstone was deleted",
        pruned=f"pruned {mark.pruned_at} by {mark.pruned_by}",
    )


def unheld_reports(
    using: str, rows: Iterable[tuple[int, str, str, Any]], agreed: dict[int, int] | None = None
) -> list[ChainReport]:
    """The runs the prune ``rows`` name that no tombstone holds; each tombstone that agrees
    with one of those rows goes into ``agreed`` (its id -> the row's id). One query per row."""
    from ..models import Tombstone

    agreed = {} if agreed is None else agreed
    out = []
    for row in rows:
        marks = _marks(*row)
        held: dict[str, list[Any]] = {}
        for stone in Tombstone.objects.using(using).filter(run_id__in=list(marks)):
            held.setdefault(stone.run_id, []).append(stone)
        for rid, mark in marks.items():
            hit = next(
                (s for s in held.get(rid, ()) if s.pk not in agreed and not differences(s, mark)),
                None,
            )
            if hit is not None:
                agreed[hit.pk] = mark.row
            elif all(s.pk in agreed for s in held.get(rid, ())):
                # Every tombstone of the run answers another prune row (an id pruned twice).
                # One that answers none differs from this row, and its own report says how.
                out.append(unheld_report(rid, mark))
    return out


def pruned_reports(using: str) -> list[ChainReport]:
    """``verify --all``'s pruned runs: each run id no run holds again, by its last
    tombstone; every other tombstone no prune row agrees with; then each run a prune row
    names that no tombstone holds."""
    from ..models import Run, Tombstone

    agreed: dict[int, int] = {}
    unheld = unheld_reports(using, _prune_rows(using).order_by("id").iterator(), agreed)
    stones = Tombstone.objects.using(using).annotate(
        live=Exists(Run.objects.using(using).filter(pk=OuterRef("run_id")))
    )
    reports = []
    last = None
    for stone in stones.order_by("run_id", "-id").iterator():
        latest = stone.run_id != last
        last = stone.run_id
        row = agreed.get(stone.pk)
        report = tombstone_report(stone) if row is None else _checked(stone, row)
        # An older tombstone of a run id, or one a run holds again, only when it fails.
        if (latest and not stone.live) or not report.ok:
            reports.append(report)
    return reports + unheld


def latest_unheld(using: str, size: int) -> list[ChainReport]:
    """The runs the latest prune rows name (rows read until ``size`` runs, at least one
    row) that no tombstone holds: the system check's sample."""
    rows = []
    named = 0
    for row in _prune_rows(using).order_by("-id").iterator():
        rows.append(row)
        named += len(_marks(*row))
        if named >= size:
            break
    return unheld_reports(using, reversed(rows))
