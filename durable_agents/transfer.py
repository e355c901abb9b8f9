"""Export runs to JSON lines and import them (the format: ``engine.export``, docs/replay.md).

``export_lines(run_id, with_forks=False)`` yields one run (and its forks, recursively) with
its journal, approval requests and decisions, halts and action log entries.
``import_bytes(data, by=..., live=False)`` (and ``import_lines``) checks the whole file
first, refuses a run id the site already holds, then writes everything in one transaction:
a refused file writes nothing. An imported run is inert evidence unless imported ``live``
(docs/replay.md, "Imports").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db import DataError, models, transaction
from django.utils import timezone

from . import __version__
from .conf import get_settings
from .database.audit import redactor
from .database.factory import store_for
from .database.spent import refuse_spent, spent_decisions
from .engine import identity
from .engine.audit import action_content, data_digest
from .engine.errors import ConfigError, Conflict, ImportRefused, NotFound, ProtocolError
from .engine.export import (
    EXPORT_FORMAT,
    RunExport,
    end_line,
    header_line,
    line,
    parse,
    record_line,
)
from .engine.imported import check_live
from .engine.journal import to_record
from .engine.names import validate_session_id
from .engine.ports import IMPORTED_INERT, IMPORTED_LIVE, Entry
from .engine.records import validate_run_id
from .engine.sensitive import Redactor
from .models import ActionLog, ApprovalRequest, Decision, Halt, JournalEntry, Run, RunImport
from .permissions import IMPORT_RUNS

__all__ = ["EXPORT_FORMAT", "export_lines", "export_runs", "import_bytes", "import_lines"]

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
    """The export of run ``run_id`` (and its forks), line by line (no newline); a missing
    run fails at once, before the first line."""
    using = _using()
    if not Run.objects.using(using).filter(pk=run_id).exists():
        raise NotFound(f"no run {run_id!r}", code="run.not_found")
    run_ids = _with_forks(run_id, using) if with_forks else [run_id]
    return export_runs(run_ids)


def export_runs(run_ids: list[str]) -> Iterator[str]:
    """The export of the runs ``run_ids`` (which must exist), line by line (no newline):
    the same format as ``export_lines``, one file for many runs (``retention.prune``)."""
    using = _using()
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
    imported = RunImport.objects.using(using).filter(run_id=run_id).exists()
    if get_settings().audit_signing_key or imported:
        from .database.audit import sign_head

        # The site vouches for the head (docs/audit.md); never for an imported head no
        # trusted key signed: that carries the file's own signature, if any.
        signed = sign_head(run_id, using=using)
        if signed["signature"]:
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


def import_lines(lines: Iterable[str], *, by: Any, live: bool = False) -> list[str]:
    """Import an export given line by line (each line's end as read, or none); the digest
    logged is that of the lines joined with ``\\n`` line ends, a final one included: the
    file's own digest when it was written so (as ``export`` writes it). See
    ``import_bytes``."""
    text = "".join(x if x.endswith("\n") else x + "\n" for x in lines)
    return import_bytes(text.encode("utf-8"), by=by, live=live)


def import_bytes(data: bytes, *, by: Any, live: bool = False) -> list[str]:
    """Import an export file's bytes as ``by``; return the run ids written.

    ``by`` (a user object, a username or an ``identity.Actor``) must name an active user
    holding ``import_runs``. Without ``live`` the runs are inert evidence: never driven,
    nothing in them decided (``engine.imported``). With ``live`` every decision in the file
    must verify here (``engine.imported.check_live``), or the whole file is refused.

    Every import is one row of the site's action log (``import``: the file's sha256, the
    runs, live or inert). The runs' own action-log rows stay evidence, on their
    ``RunImport``: they happened on another site, and never join this site's chain.

    Refuses (``ProtocolError``, ``JournalVersionError``, ``Conflict`` ``run.exists``,
    ``ImportRefused``, ``ActorError``) before writing anything."""
    actor = identity.resolve(by)
    identity.require(actor, IMPORT_RUNS, "import runs")
    if not isinstance(live, bool):
        raise ConfigError("live must be True or False", code="config.invalid")
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"the file is not UTF-8 text: {exc}", code="export.invalid") from None
    export = parse(text.splitlines())  # also verifies the file's audit chains (docs/audit.md)
    for run in export.runs.values():
        _check_ids(run)
    using = _using()
    taken = sorted(Run.objects.using(using).filter(pk__in=export.runs).values_list("pk", flat=True))
    if taken:
        raise Conflict(
            f"this site already has run {', '.join(map(repr, taken))}; import into another site",
            code="run.exists",
        )
    # A run this site held and deleted may not come back, inert or live: its id is spent.
    refuse_spent(using, export.runs)
    if live:
        _refuse_spent_decisions(using, export)
        for run in export.runs.values():
            check_live(run, store_for(using))
    imported = IMPORTED_LIVE if live else IMPORTED_INERT
    try:
        with transaction.atomic(using=using):
            for run in export.runs.values():
                _write_run(run, export.header, using, imported, actor, digest)
            store_for(using).log_action(
                identity.logged(
                    actor,
                    "import",
                    next(iter(export.runs)),
                    "",
                    {"digest": digest, "runs": list(export.runs), "live": live},
                )
            )
    except DataError as exc:
        # A value the checks above let through but a column cannot hold (too long, a NUL):
        # the file's fault, and the transaction wrote nothing.
        raise ProtocolError(
            f"the file holds a value this site cannot store: {exc}".strip(),
            code="export.invalid",
        ) from None
    return list(export.runs)


def _check_ids(run: RunExport) -> None:
    """Refuse (``config.run_id``, ``config.session_id``) an id in the file that no run
    started here could have: a run id, or a row's link to another run or a session."""
    validate_run_id(run.run_id, derived=True)
    for link in ("parent_run_id", "root_run_id", "forked_from"):
        value = run.row.get(link)
        if value is not None:
            validate_run_id(value, derived=True)
    if run.row.get("session_id") is not None:
        validate_session_id(run.row["session_id"])


def _refuse_spent_decisions(using: str, export: Any) -> None:
    """Refuse a live import carrying a signed decision of a run this site deleted: that
    decision was given for one firing, here, and may have had it."""
    signatures = [
        str(row.get("signature"))
        for run in export.runs.values()
        for row in run.rows.get("decision", ())
        if row.get("signature")
    ]
    spent = spent_decisions(using, signatures)
    if spent:
        first = spent[0]
        raise ImportRefused(
            f"the file carries the decision of {first.approver!r} on call {first.call_id!r} "
            f"of run {first.run_id!r}, a run this site deleted: a signed decision authorises "
            "one firing, and it was spent here. Nothing was imported",
            code="import.decision_spent",
        )


def _write_run(
    run: RunExport, header: dict[str, Any], using: str, imported: str, actor: Any, digest: str
) -> None:
    row = {**_fields(Run, run.row), "run_id": run.run_id, "imported": imported}
    Run.objects.using(using).create(**row)
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
    for item in run.rows.get("approval_request", ()):
        fields = _fields(ApprovalRequest, item)
        # The start a request was asked under, by its new position.
        fields["start_seq"] = seqs.get(int(item.get("start_seq") or 0), 0)
        requests[str(item.get("call_id"))] = ApprovalRequest.objects.using(using).create(
            run_id=run.run_id, **fields
        )
    for item in run.rows.get("decision", ()):
        request = requests.get(str(item.get("call_id")))
        if request is None:
            raise ProtocolError(
                f"a decision of run {run.run_id!r} is about call {item.get('call_id')!r}, "
                "which has no approval request in the file",
                code="export.invalid",
            )
        Decision.objects.using(using).create(request=request, **_fields(Decision, item))
    for item in run.rows.get("halt", ()):
        Halt.objects.using(using).create(run_id=run.run_id, **_fields(Halt, item))
    RunImport.objects.using(using).create(
        run_id=run.run_id,
        live=imported == IMPORTED_LIVE,
        imported_by=actor.username,
        imported_by_id=actor.id,
        file_digest=digest,
        exported_at=str(header.get("exported_at") or "")[:64],
        library=str(header.get("library") or "")[:64],
        head=run.head,
        records=len(run.records),
        head_signature=run.head_signature,
        public_key=run.public_key,
        actions=[{k: v for k, v in a.items() if k != "type"} for a in run.rows.get("action", ())],
    )
