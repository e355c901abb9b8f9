"""The export format: one or more runs as JSON lines (docs/replay.md, "Export format").

Line 1 is the header (``type: "header"``): the export format, the journal format of every
run in it, and the runs it holds. Then, per run: its ``run`` row, its journal ``record``s in
commit order (each record's canonical text as a string, byte for byte), and its
``approval_request``, ``decision``, ``halt`` and ``action`` rows. The last line
(``type: "end"``) counts the lines before it, so a truncated file is refused.

This module writes and reads the lines; storing them is the glue's (``durable_agents
.transfer``). Reading refuses, before anything is stored, a file of another export format,
one whose runs are in a journal format other than the header says or this version reads,
and a malformed or truncated file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .audit import ACTION_NAME, Link, action_content, chain_hash, verify_links
from .errors import JournalVersionError, ProtocolError
from .records import HEADER_NAME, JOURNAL_FORMAT, SUPPORTED_FORMATS, Record, decode

EXPORT_FORMAT = "durable_agents.export.v1"
ROW_TYPES = ("run", "approval_request", "decision", "halt", "action")


def line(value: Mapping[str, Any]) -> str:
    """One line of an export: compact JSON, keys sorted, non-ASCII as itself."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def header_line(
    run_ids: Sequence[str], *, exported_at: datetime, library: str, redacted: bool = False
) -> str:
    return line(
        {
            "type": "header",
            "format": EXPORT_FORMAT,
            "journal_format": JOURNAL_FORMAT,
            "runs": list(run_ids),
            "exported_at": exported_at.isoformat(),
            "library": library,
            **({"redacted": True} if redacted else {}),
        }
    )


def record_line(record: Record, hash: str | None = None, *, digest: str | None = None) -> str:
    """A record's line; ``hash`` is its audit-chain hash (docs/audit.md), None if unchained.
    ``digest`` (the stored text's data digest) marks ``record.data`` as redacted."""
    return line(
        {
            "type": "record",
            "run_id": record.run_id,
            "seq": record.seq,
            "name": record.name,
            "data": record.data,
            "created_at": record.created_at.isoformat() if record.created_at else None,
            "hash": hash,
            **({"digest": digest, "redacted": True} if digest is not None else {}),
        }
    )


def end_line(count: int) -> str:
    """The last line: how many lines came before it."""
    return line({"type": "end", "lines": count})


@dataclass
class RunExport:
    """One run of an export: its row, its records in commit order, its other rows."""

    run_id: str
    row: dict[str, Any] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    hashes: list[str | None] = field(default_factory=list)  # beside ``records``
    head: str | None = None  # the chain head the run line states
    # The exporting site's signature over ``audit.head_message`` of that head, and its
    # public key (base64), when it signed it: kept by an import, trusted only under a key
    # the importing site trusts.
    head_signature: str | None = None
    public_key: str | None = None


@dataclass
class Export:
    header: dict[str, Any]
    runs: dict[str, RunExport]


def _refuse(message: str, code: str = "export.invalid") -> ProtocolError:
    return ProtocolError(message, code=code)


def parse(lines: Iterable[str]) -> Export:
    """Read an export, checking all of it; raise ``ProtocolError`` (``export.format``,
    ``export.invalid``) or ``JournalVersionError`` saying what is wrong."""
    header: dict[str, Any] | None = None
    runs: dict[str, RunExport] = {}
    count = 0
    ended = False
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if ended:
            raise _refuse(f"line {number}: there are lines after the end line")
        try:
            item = json.loads(raw)
        except ValueError as exc:
            raise _refuse(f"line {number} is not JSON: {exc}") from None
        if not isinstance(item, dict):
            raise _refuse(f"line {number} is not a JSON object")
        kind = item.get("type")
        if header is None:
            header = _check_header(item)
            runs = {run_id: RunExport(run_id) for run_id in header["runs"]}
        elif kind == "end":
            if item.get("lines") != count:
                raise _refuse(
                    f"the end line counts {item.get('lines')!r} lines, the file has {count}: "
                    "it was cut or edited"
                )
            ended = True
        elif item.get("redacted"):
            raise _redacted(f"line {number}")
        elif kind == "record":
            _add_record(runs, header, item, number)
        elif kind in ROW_TYPES:
            run = runs.get(str(item.get("run_id")))
            if run is None:
                raise _refuse(f"line {number}: run {item.get('run_id')!r} is not in the header")
            if kind == "run":
                run.row = dict(item.get("row") or {})
                head = item.get("head")
                run.head = head if isinstance(head, str) else None
                signature, key = item.get("head_signature"), item.get("public_key")
                if (
                    isinstance(signature, str)
                    and isinstance(key, str)
                    and len(signature) <= 200
                    and len(key) <= 100
                ):
                    run.head_signature, run.public_key = signature, key
            else:
                run.rows.setdefault(str(kind), []).append(item)
        else:
            raise _refuse(f"line {number}: unknown line type {kind!r}")
        count += 1
    if header is None:
        raise _refuse("the file is empty: an export starts with its header line", "export.format")
    if not ended:
        raise _refuse("the file has no end line: it was cut short")
    for run in runs.values():
        if not run.row:
            raise _refuse(f"run {run.run_id!r} has no run line")
        if not run.records:
            raise _refuse(f"run {run.run_id!r} has no journal records")
        _check_chains(run)
    return Export(header, runs)


def _check_chains(run: RunExport) -> None:
    """Refuse a run whose journal or action rows do not verify (docs/audit.md)."""
    links = [Link(r.seq, r.name, r.data, h) for r, h in zip(run.records, run.hashes, strict=True)]
    report = verify_links(run.run_id, links)
    if not report.ok:
        raise _refuse(
            f"run {run.run_id!r}: the audit chain is broken at record {report.broken_name!r} "
            f"(seq {report.broken_at}): {report.reason}. The file was changed after export",
            "export.chain",
        )
    if run.head is not None and report.head != run.head:
        raise _refuse(
            f"run {run.run_id!r}: the file's records end at chain head {report.head!r}, not at "
            f"the head its run line states ({run.head!r}): records were removed from the end",
            "export.chain",
        )
    for row in run.rows.get("action", ()):
        stated = row.get("hash")
        if stated is None:
            continue  # logged before the chain existed
        prev = row.get("prev")
        if not isinstance(prev, str | None) or stated != chain_hash(
            prev, ACTION_NAME, action_content(row)
        ):
            raise _refuse(
                f"run {run.run_id!r}: action-log row {row.get('action')!r} by "
                f"{row.get('actor')!r} does not match its hash: it was changed after export",
                "export.chain",
            )


def _redacted(where: str) -> ProtocolError:
    return _refuse(
        f"{where}: this export is redacted (sensitive values of its tool calls are shown as "
        "salted hashes): it verifies, but cannot be imported or replayed, since the values "
        "it hides cannot be restored. Export the run without sensitive tool fields to move it",
        "export.redacted",
    )


def _check_header(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") != "header":
        raise _refuse(
            "the first line is not an export header: this is not a durable_agents export",
            "export.format",
        )
    fmt = item.get("format")
    if fmt != EXPORT_FORMAT:
        raise _refuse(
            f"the file is in export format {fmt!r}; this version reads {EXPORT_FORMAT!r}. "
            "Import it with the version that exported it",
            "export.format",
        )
    journal_format = item.get("journal_format")
    if journal_format not in SUPPORTED_FORMATS:
        raise JournalVersionError(
            f"the file's runs are in journal format {journal_format!r}; this version reads "
            f"{', '.join(SUPPORTED_FORMATS)}",
            found=journal_format,
            supported=list(SUPPORTED_FORMATS),
        )
    if item.get("redacted"):
        raise _redacted("the header")
    run_ids = item.get("runs")
    if (
        not isinstance(run_ids, list)
        or not run_ids
        or not all(isinstance(r, str) and r for r in run_ids)
        or len(set(run_ids)) != len(run_ids)
    ):
        raise _refuse("the header's runs must list the run ids in the file, each once")
    return item


def _add_record(
    runs: dict[str, RunExport], header: dict[str, Any], item: dict[str, Any], number: int
) -> None:
    run = runs.get(str(item.get("run_id")))
    if run is None:
        raise _refuse(f"line {number}: run {item.get('run_id')!r} is not in the header")
    name, data, seq = item.get("name"), item.get("data"), item.get("seq")
    if not isinstance(name, str) or not isinstance(data, str) or not isinstance(seq, int):
        raise _refuse(f"line {number}: a record needs a name, a seq and its data as text")
    if run.records and seq <= run.records[-1].seq:
        raise _refuse(f"line {number}: records of run {run.run_id!r} are not in commit order")
    if any(r.name == name for r in run.records):
        raise _refuse(f"line {number}: run {run.run_id!r} has two records named {name!r}")
    try:
        body = decode(data)
    except ProtocolError as exc:
        raise _refuse(f"line {number}: record {name!r} is not valid JSON: {exc}") from None
    if not run.records:
        found = body.get("format") if isinstance(body, dict) else None
        if name != HEADER_NAME or found != header["journal_format"]:
            raise JournalVersionError(
                f"run {run.run_id!r} does not start with a {header['journal_format']!r} "
                f"journal header (found {name!r}, format {found!r})",
                found=found,
                supported=list(SUPPORTED_FORMATS),
            )
    created = item.get("created_at")
    stated = item.get("hash")
    if stated is not None and not isinstance(stated, str):
        raise _refuse(f"line {number}: a record's hash must be a string or null")
    run.hashes.append(stated)
    run.records.append(
        Record(
            run.run_id,
            name,
            seq,
            data,
            datetime.fromisoformat(created) if isinstance(created, str) else None,
        )
    )
