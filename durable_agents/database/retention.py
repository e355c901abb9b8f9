"""Retention: ``prune`` exports finished runs, then deletes them, leaving a signed tombstone
each (docs/retention.md).

The unit is a **tree**: a top-level agent run with every sub-run below it. A tree goes only
whole, and only when every run in it is terminal (finished, cancelled, compensated) and
finished before the cutoff, nothing in it was imported, none of it belongs to a session,
and no run outside it was forked from a run in it (a fork references its source's ended
sub-runs: ``engine.commands.tree_forks``).

Each batch of trees is exported to one file (the ``export`` format), written and fsynced
before anything is deleted. Then one short transaction per batch takes each tree's rows
without waiting (``FOR UPDATE SKIP LOCKED`` and ``pg_try_advisory_xact_lock`` on the lock
the chain trigger takes: a busy tree is skipped, never waited on), checks again that it is
still terminal, still before the cutoff and unchanged since it was exported (same head,
same record count, same ``updated_at``), writes its tombstones and the batch's action-log
row, and deletes it. A crash anywhere leaves each tree either whole or gone with its
tombstone; running ``prune`` again finishes the work.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, Max
from django.utils import timezone

from ..conf import get_settings
from ..engine import failpoints, identity
from ..engine import retention as rules
from ..engine.audit import tombstone_message
from ..engine.errors import ConfigError
from ..engine.ports import KIND_AGENT, TERMINAL_STATUSES, ActionInfo
from ..engine.spent import PRUNED
from ..models import (
    ApprovalRequest,
    Decision,
    Follower,
    Halt,
    JournalEntry,
    Lease,
    Run,
    RunImport,
    Slot,
    Throttle,
    Tombstone,
)
from ..permissions import DELETE_RUN
from .factory import store_for
from .spent import retire

__all__ = ["PruneReport", "prune"]

BATCH = 500
# The lock the journal's chain trigger takes per run (migration 0012): holding it, no record
# of the run is being hashed by someone else's uncommitted transaction.
_CHAIN_LOCK = 1684107620

# Why a tree is kept: the engine's words (``engine.retention``), kept importable from here.
KEPT_UNFINISHED = rules.KEPT_UNFINISHED
KEPT_RECENT = rules.KEPT_RECENT
KEPT_IMPORTED = rules.KEPT_IMPORTED
KEPT_SESSION = rules.KEPT_SESSION
KEPT_FORKED = rules.KEPT_FORKED
KEPT_BUSY = rules.KEPT_BUSY
KEPT_CHANGED = rules.KEPT_CHANGED


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    pruned: list[str] = field(default_factory=list)  # every run deleted, sub-runs included
    kept: dict[str, str] = field(default_factory=dict)  # tree root -> why
    files: list[dict[str, Any]] = field(default_factory=list)  # {"file", "sha256", "runs"}
    batches: int = 0


@dataclass
class _Tree:
    root: str
    members: list[dict[str, Any]]

    @property
    def run_ids(self) -> list[str]:
        return [m["run_id"] for m in self.members]


def prune(
    *,
    finished_before: datetime,
    by: Any,
    export_dir: str | os.PathLike[str] | None,
    batch: int = BATCH,
    dry_run: bool = False,
    using: str | None = None,
) -> PruneReport:
    """Export, then delete, the trees of runs finished before ``finished_before``, as
    ``by`` (who needs ``delete_run``). ``export_dir`` None: no export, tombstones only.
    Refuses bad input (``ConfigError``) before reading or deleting anything. ``using``: the
    database alias (default: the ``DATABASE`` setting's)."""
    actor = identity.resolve(by)
    identity.require(actor, DELETE_RUN, "prune runs")
    if timezone.is_naive(finished_before):
        raise ConfigError("the cutoff must carry a time zone", code="prune.cutoff")
    if finished_before > timezone.now():
        raise ConfigError(
            f"the cutoff {finished_before.isoformat()} is in the future: prune deletes runs "
            "finished before it, so it would delete runs that have not aged at all",
            code="prune.cutoff",
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise ConfigError(f"the batch size must be 1 to 10000, not {batch!r}", code="prune.batch")
    folder = check_export_dir(export_dir) if export_dir is not None else None
    using = get_settings().database if using is None else using
    report = PruneReport(finished_before, dry_run)
    after: tuple[datetime, str] | None = None
    while True:
        roots = _roots(using, finished_before, after, batch)
        if not roots:
            return report
        after = (roots[-1]["finished_at"], roots[-1]["run_id"])
        trees = _judge(using, roots, finished_before, report)
        if dry_run:
            report.pruned += [rid for t in trees for rid in t.run_ids]
            continue
        if trees:
            _prune_batch(using, trees, finished_before, actor, folder, report)
            failpoints.hit("prune-after-batch")


def check_export_dir(export_dir: str | os.PathLike[str]) -> Path:
    """The export folder, proven writable by writing a file there; ``ConfigError`` else."""
    folder = Path(export_dir)
    if not folder.is_dir():
        raise ConfigError(f"export dir {str(folder)!r} is not a directory", code="prune.export")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".prune-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"export dir {str(folder)!r} is not writable: {exc}", code="prune.export"
        ) from None
    return folder


_FIELDS = rules.FIELDS


def _roots(
    using: str, cutoff: datetime, after: tuple[datetime, str] | None, batch: int
) -> list[dict[str, Any]]:
    from django.db.models import Q

    rows = Run.objects.using(using).filter(
        parent_run_id__isnull=True,
        kind=KIND_AGENT,
        status__in=sorted(TERMINAL_STATUSES),
        finished_at__lt=cutoff,
    )
    if after is not None:
        rows = rows.filter(
            Q(finished_at__gt=after[0]) | Q(finished_at=after[0], run_id__gt=after[1])
        )
    return list(rows.order_by("finished_at", "run_id").values(*_FIELDS)[:batch])


def _judge(
    using: str, roots: list[dict[str, Any]], cutoff: datetime, report: PruneReport
) -> list[_Tree]:
    """The trees of ``roots`` that may go; the others are noted in ``report.kept``."""
    runs = Run.objects.using(using)
    ids = [r["run_id"] for r in roots]
    below: dict[str, list[dict[str, Any]]] = {rid: [] for rid in ids}
    for row in runs.filter(root_run_id__in=ids).exclude(run_id__in=ids).values(*_FIELDS):
        below[row["root_run_id"]].append(row)
    trees = [_Tree(r["run_id"], [r, *below[r["run_id"]]]) for r in roots]
    every = {m["run_id"] for t in trees for m in t.members}
    outside = _referrers(using, every)
    going = []
    for tree in trees:
        why = _why_kept(tree, cutoff, outside)
        if why:
            report.kept[tree.root] = why
        else:
            going.append(tree)
    return going


def _referrers(using: str, run_ids: Iterable[str]) -> dict[str, str]:
    """Runs naming one of ``run_ids`` as their source or parent: ``{named: referrer}``."""
    ids = list(run_ids)
    found: dict[str, str] = {}
    rows = Run.objects.using(using)
    for rid, src in rows.filter(forked_from__in=ids).values_list("run_id", "forked_from"):
        found.setdefault(str(src), rid)
    for rid, parent in rows.filter(parent_run_id__in=ids).values_list("run_id", "parent_run_id"):
        found.setdefault(str(parent), rid)
    return found


def _why_kept(tree: _Tree, cutoff: datetime, referrers: dict[str, str]) -> str:
    return rules.why_kept(tree.members, cutoff, referrers)


def _chains(using: str, run_ids: list[str]) -> dict[str, tuple[int, str | None, int]]:
    """Each run's record count, head and unchained prefix, as it stands."""
    out: dict[str, tuple[int, str | None, int]] = {rid: (0, None, 0) for rid in run_ids}
    entries = JournalEntry.objects.using(using).filter(run_id__in=run_ids)
    stats = entries.values("run_id").annotate(n=Count("seq"), last=Max("seq"))
    lasts = {s["last"]: (s["run_id"], s["n"]) for s in stats}
    heads = dict(entries.filter(seq__in=list(lasts)).values_list("seq", "hash"))
    unchained = dict(
        entries.filter(hash__isnull=True)
        .values("run_id")
        .annotate(n=Count("seq"))
        .values_list("run_id", "n")
    )
    for seq, (rid, n) in lasts.items():
        out[rid] = (n, heads.get(seq), unchained.get(rid, 0))
    return out


def _present(using: str, trees: list[_Tree]) -> list[_Tree]:
    """The trees every run of which is still here."""
    ids = [rid for t in trees for rid in t.run_ids]
    here = set(Run.objects.using(using).filter(pk__in=ids).values_list("pk", flat=True))
    return [t for t in trees if set(t.run_ids) <= here]


def _write_export(folder: Path, run_ids: list[str], stamp: str) -> tuple[Path, str]:
    """Write the export of ``run_ids`` under ``folder``; durable (file and folder fsynced)
    before this returns. Its name and sha256."""
    from ..transfer import export_runs

    name = folder / f"prune-{stamp}-{os.getpid()}.jsonl"
    part = name.with_name(name.name + ".part")
    digest = hashlib.sha256()
    try:
        with open(part, "wb") as f:
            for text in export_runs(run_ids):
                data = (text + "\n").encode("utf-8")
                digest.update(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, name)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return name, digest.hexdigest()


@dataclass
class _Batch:
    """A batch as judged and exported, before its transaction: what the tombstones state."""

    trees: list[_Tree]
    every: list[str]  # every run of the trees
    seen: dict[str, dict[str, Any]]  # run id -> its row as judged
    chains: dict[str, tuple[int, str | None, int]]  # run id -> (records, head, unchained)
    pruned_at: datetime
    file_name: str = ""
    sha256: str = ""


def _prune_batch(
    using: str,
    trees: list[_Tree],
    cutoff: datetime,
    actor: identity.Actor,
    folder: Path | None,
    report: PruneReport,
) -> None:
    batch = _exported(using, trees, folder)
    if batch is None:
        return
    signer = _signer()
    postgres = connections[using].vendor == "postgresql"
    with transaction.atomic(using=using):
        locked = _lock(using, batch.every, postgres)
        gone = _still_prunable(using, batch, locked, cutoff, report)
        if not gone:
            return
        ids = [rid for t in gone for rid in t.run_ids]
        Tombstone.objects.using(using).bulk_create(_tombstones(batch, ids, actor, signer))
        failpoints.hit("prune-after-tombstones")
        _delete(using, ids)
        # The delete is the last write: only now, holding the rows, is a fork made of them
        # in the meantime seen (a fork re-reads its source under a share lock after creating
        # its row, so it either is seen here or finds its source gone: forks.fork_run).
        late = _referrers(using, ids)
        if any(ref not in ids for ref in late.values()):
            transaction.set_rollback(True, using=using)
            for tree in gone:
                report.kept[tree.root] = KEPT_FORKED
            return
        store_for(using).log_action(_logged_prune(actor, cutoff, batch, ids, len(gone)))
        failpoints.hit("prune-before-commit")
    report.batches += 1
    report.pruned += ids
    if batch.file_name:
        report.files.append(
            {"file": batch.file_name, "sha256": batch.sha256, "runs": len(batch.every)}
        )


def _exported(using: str, trees: list[_Tree], folder: Path | None) -> _Batch | None:
    """The trees still here, judged as they are now, and exported under ``folder`` when
    given; None when none is left."""
    while True:
        # Another prune may have taken a tree since it was judged, even while this one
        # exports it: drop what is gone and export again.
        trees = _present(using, trees)
        if not trees:
            return None
        every = [rid for t in trees for rid in t.run_ids]
        seen = {m["run_id"]: m for t in trees for m in t.members}
        batch = _Batch(trees, every, seen, _chains(using, every), timezone.now())
        if folder is None:
            return batch
        stamp = batch.pruned_at.strftime("%Y%m%dT%H%M%S%fZ")
        try:
            path, batch.sha256 = _write_export(folder, every, stamp)
        except Run.DoesNotExist:
            continue
        batch.file_name = path.name
        failpoints.hit("prune-after-export")
        return batch


def _signer() -> tuple[Any, str] | None:
    """The site's ``AUDIT_SIGNING_KEY`` and its public key (base64), or None."""
    settings = get_settings()
    if not settings.audit_signing_key:
        return None
    from .audit import _load_key, _public

    key = _load_key(settings.audit_signing_key)
    return key, _public(key)


def _still_prunable(
    using: str, batch: _Batch, locked: set[str], cutoff: datetime, report: PruneReport
) -> list[_Tree]:
    """The batch's trees to delete, judged again under the lock; why each other one stays
    goes in ``report`` (a tree another prune took since the export is neither)."""
    gone: list[_Tree] = []
    for tree in batch.trees:
        why = ""
        if not Run.objects.using(using).filter(pk__in=tree.run_ids).exists():
            continue  # another prune took it since the export
        if not set(tree.run_ids) <= locked:
            why = KEPT_BUSY
        else:
            now = {
                r["run_id"]: r
                for r in Run.objects.using(using).filter(pk__in=tree.run_ids).values(*_FIELDS)
            }
            again = _chains(using, tree.run_ids)
            if any(
                rid not in now
                or now[rid]["updated_at"] != batch.seen[rid]["updated_at"]
                or again[rid] != batch.chains[rid]
                for rid in tree.run_ids
            ):
                why = KEPT_CHANGED
            why = why or _why_kept(_Tree(tree.root, list(now.values())), cutoff, {})
            if not why and Lease.objects.using(using).filter(run_id__in=tree.run_ids).exists():
                why = KEPT_BUSY
        if why:
            report.kept[tree.root] = why
        else:
            gone.append(tree)
    return gone


def _tombstones(
    batch: _Batch, ids: list[str], actor: identity.Actor, signer: tuple[Any, str] | None
) -> list[Tombstone]:
    """A tombstone for each run of ``ids``, signed when the site has a signing key."""
    stones = []
    for rid in ids:
        records, head, unchained = batch.chains[rid]
        row = batch.seen[rid]
        stone = Tombstone(
            run_id=rid,
            agent=row["agent"],
            status=row["status"],
            root_run_id=row["root_run_id"],
            finished_at=row["finished_at"],
            head=head,
            records=records,
            unchained=unchained,
            pruned_at=batch.pruned_at,
            pruned_by=actor.username,
            pruned_by_id=actor.id,
            export_file=batch.file_name,
            export_sha256=batch.sha256,
        )
        if signer is not None:
            key, public_key = signer
            message = tombstone_message(
                rid, head, records, export_sha256=batch.sha256,
                pruned_at=batch.pruned_at.isoformat(), pruned_by=actor.username,
            )  # fmt: skip
            stone.signature = base64.b64encode(key.sign(message)).decode()
            stone.public_key = public_key
        stones.append(stone)
    return stones


def _logged_prune(
    actor: identity.Actor, cutoff: datetime, batch: _Batch, ids: list[str], trees: int
) -> ActionInfo:
    """The action-log row of a batch deleted."""
    chains = batch.chains
    return identity.logged(
        actor,
        "prune",
        "",
        batch.file_name,
        {
            "finished_before": cutoff.isoformat(),
            "runs": ids,
            "trees": trees,
            "records": sum(chains[rid][0] for rid in ids),
            "export": {"file": batch.file_name, "sha256": batch.sha256}
            if batch.file_name
            else None,
            # What each tombstone states, in the chained log: ``verify`` holds every
            # tombstone to the row that wrote it (``database.tombstones``).
            "pruned_at": batch.pruned_at.isoformat(),
            "tombstones": {
                rid: {
                    "head": chains[rid][1],
                    "records": chains[rid][0],
                    "unchained": chains[rid][2],
                }
                for rid in ids
            },
        },
    )


def _lock(using: str, run_ids: list[str], postgres: bool) -> set[str]:
    """Lock the rows of ``run_ids`` that nobody else holds; the ids locked. On SQLite the
    transaction's write lock already excludes every other writer."""
    rows = Run.objects.using(using).filter(pk__in=run_ids).order_by("pk")
    if not postgres:
        return set(rows.values_list("pk", flat=True))
    locked = set(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))
    held = set()
    with connections[using].cursor() as cursor:
        for rid in sorted(locked):
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))", [_CHAIN_LOCK, rid])
            if cursor.fetchone()[0]:
                held.add(rid)
    return held


def _delete(using: str, run_ids: list[str]) -> None:
    """Every row of ``run_ids``; the action log stays (it is the site's chain), and their
    ids and signed decisions are spent (``engine.spent``)."""
    retire(using, run_ids, PRUNED)
    db = Run.objects.using(using)
    Decision.objects.using(using).filter(request__run_id__in=run_ids).delete()
    ApprovalRequest.objects.using(using).filter(run_id__in=run_ids).delete()
    Halt.objects.using(using).filter(run_id__in=run_ids).delete()
    Lease.objects.using(using).filter(run_id__in=run_ids).delete()
    Follower.objects.using(using).filter(run_id__in=run_ids).delete()
    Throttle.objects.using(using).filter(run_id__in=run_ids).delete()
    Slot.objects.using(using).filter(run_id__in=run_ids).delete()
    RunImport.objects.using(using).filter(run_id__in=run_ids).delete()
    JournalEntry.objects.using(using).filter(run_id__in=run_ids).delete()
    db.filter(pk__in=run_ids).delete()
