"""Export runs to JSON lines and import them (the format: ``engine.export``, docs/replay.md).

``export_lines(run_id, with_forks=False)`` yields one run (and its forks, recursively) with
its journal, approval requests and decisions, halts and action log entries.
``import_lines(lines)`` checks the whole file first, refuses a run id the site already
holds, then writes everything in one transaction: a refused file writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from . import __version__
from .audit import redactor
from .conf import get_settings
from .engine.audit import action_content, data_digest
from .engine.errors import Conflict, NotFound, ProtocolError
from .engine.export import EXPORT_FORMAT, end_line, header_line, line, parse, record_line
from .engine.journal import to_record
from .engine.ports import Entry
from .engine.sensitive import Redactor
from .models import ActionLog, ApprovalRequest, Decision, Halt, JournalEntry, Run
from .storage import DjangoStore

__all__ = ["EXPORT_FORMAT", "export_lines", "import_lines"]

# Row fields an export leaves out: primary keys and links this site assigns again on import.
_SKIP = {"id", "run", "request"}


def _using() -> str:
    return get_settings().database


def _row(obj: models.Model, skip: set[str] = _SKIP) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in obj._meta.concrete_fields:
        if f.name in skip:
            continue
        value = getattr(obj, f.attname)
        out[f.name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _fields(model: type[models.Model], row: dict[str, Any]) -> dict[str, Any]:
    """``row``'s values for ``model``'s own fields, dates parsed (unknown keys dropped)."""
    out: dict[str, Any] = {}
    for f in model._meta.concrete_fields:
        if f.name in _SKIP or f.name not in row:
            continue
        value = row[f.name]
        if isinstance(f, models.DateTimeField) and isinstance(value, str):
            value = datetime.fromisoformat(value)
        out[f.attname] = value
    return out


def _with_forks(run_id: str, using: str) -> list[str]:
    found, frontier = [run_id], [run_id]
    while frontier:
        frontier = list(
            Run.objects.using(using)
            .filter(forked_from__in=frontier)
            .order_by("created_at", "run_id")
            .values_list("run_id", flat=True)
        )
        found.extend(r for r in frontier if r not in found)
    return found


def export_lines(run_id: str, *, with_forks: bool = False) -> Iterator[str]:
    """The export of run ``run_id`` (and its forks), line by line (no newline)."""
    using = _using()
    if not Run.objects.using(using).filter(pk=run_id).exists():
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    run_ids = _with_forks(run_id, using) if with_forks else [run_id]
    hiders = {rid: redactor(rid, using=using) for rid in run_ids}
    count = 1
    yield header_line(
        run_ids,
        exported_at=timezone.now(),
        library=__version__,
        redacted=any(h.active for h in hiders.values()),
    )
    for rid in run_ids:
        for text in _run_lines(rid, using, hiders[rid]):
            count += 1
            yield text
    yield end_line(count)


def _run_lines(run_id: str, using: str, hide: Redactor) -> Iterator[str]:
    """One run's lines; ``hide`` shows its sensitive values as salted hashes: a redacted
    record carries its data digest, a redacted action row its content's (docs/audit.md)."""
    run = Run.objects.using(using).get(pk=run_id)
    entries = JournalEntry.objects.using(using).filter(run_id=run_id).order_by("seq")
    head = entries.reverse().values_list("hash", flat=True).first()
    row = hide.redact("run", _row(run))
    item: dict[str, Any] = {"type": "run", "run_id": run_id, "row": row, "head": head}
    if get_settings().audit_signing_key:  # the site vouches for the head (docs/audit.md)
        from .audit import sign_head

        signed = sign_head(run_id, using=using)
        item.update(head_signature=signed["signature"], public_key=signed["public_key"])
    yield line(item)
    for e in entries.iterator():
        shown = hide.redact_text(e.name, e.data)
        record = to_record(Entry(run_id, e.name, e.seq, shown, e.created_at))
        yield record_line(record, e.hash, digest=data_digest(e.data) if shown != e.data else None)
    requests = ApprovalRequest.objects.using(using).filter(run_id=run_id).order_by("created_at")
    for r in requests:
        where = f"approval_request:{r.call_id}"
        yield line({"type": "approval_request", "run_id": run_id, **hide.redact(where, _row(r))})
    decisions = (
        Decision.objects.using(using)
        .filter(request__run_id=run_id)
        .select_related("request")
        .order_by("created_at", "id")
    )
    for d in decisions:
        fields = hide.redact(f"decision:{d.request.call_id}:{d.approver}", _row(d))
        yield line({"type": "decision", "run_id": run_id, "call_id": d.request.call_id, **fields})
    for h in Halt.objects.using(using).filter(run_id=run_id).order_by("created_at"):
        yield line({"type": "halt", "run_id": run_id, **hide.redact(f"halt:{h.pk}", _row(h))})
    actions = ActionLog.objects.using(using).filter(run_id=run_id).order_by("id")
    log = ActionLog.objects.using(using).order_by("-id").values_list("hash", flat=True)
    for a in actions:
        # The hash of the row before it in the site's chain, so each row verifies alone.
        prev = log.filter(id__lt=a.id).first()
        fields = _row(a)
        shown = hide.redact(f"action:{a.id}", fields)
        extra = {"digest": data_digest(action_content(fields)), "redacted": True}
        yield line({"type": "action", **shown, "prev": prev, **(extra if shown != fields else {})})


def import_lines(lines: Iterable[str]) -> list[str]:
    """Import an export; return the run ids written. Refuses (``ProtocolError``,
    ``JournalVersionError``, ``Conflict`` ``run.exists``) before writing anything."""
    export = parse(lines)  # also verifies the file's audit chains (docs/audit.md)
    using = _using()
    taken = sorted(Run.objects.using(using).filter(pk__in=export.runs).values_list("pk", flat=True))
    if taken:
        raise Conflict(
            f"this site already has run {', '.join(map(repr, taken))}; delete it first or "
            "import into another site",
            code="run.exists",
        )
    with transaction.atomic(using=using):
        for run in export.runs.values():
            Run.objects.using(using).create(**{**_fields(Run, run.row), "run_id": run.run_id})
            seqs: dict[int, int] = {}
            for rec in run.records:
                entry = JournalEntry.objects.using(using).create(
                    run_id=run.run_id,
                    name=rec.name,
                    data=rec.data,
                    **({"created_at": rec.created_at} if rec.created_at else {}),
                )
                seqs[rec.seq] = entry.seq
            requests: dict[str, ApprovalRequest] = {}
            for row in run.rows.get("approval_request", ()):
                fields = _fields(ApprovalRequest, row)
                # The start a request was asked under, by its new position.
                fields["start_seq"] = seqs.get(int(row.get("start_seq") or 0), 0)
                requests[str(row.get("call_id"))] = ApprovalRequest.objects.using(using).create(
                    run_id=run.run_id, **fields
                )
            for row in run.rows.get("decision", ()):
                request = requests.get(str(row.get("call_id")))
                if request is None:
                    raise ProtocolError(
                        f"a decision of run {run.run_id!r} is about call {row.get('call_id')!r}, "
                        "which has no approval request in the file",
                        code="export.invalid",
                    )
                Decision.objects.using(using).create(request=request, **_fields(Decision, row))
            for row in run.rows.get("halt", ()):
                Halt.objects.using(using).create(run_id=run.run_id, **_fields(Halt, row))
            store = DjangoStore(using)
            for row in run.rows.get("action", ()):
                # Appended to this site's action-log chain (a new hash, this site's order).
                fields = {**_fields(ActionLog, row), "run_id": run.run_id}
                fields.pop("hash", None)
                store.append_action(fields)
    return list(export.runs)
