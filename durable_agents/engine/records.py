"""Journal records: the canonical JSON encoding, and the rules for run ids and step names.

The encoding is what every store persists, byte for byte: JSON with keys sorted, no
insignificant whitespace, no HTML escaping, non-ASCII written as itself, and U+2028/U+2029
written as escapes (so a record can be embedded in a page or a JS string unchanged).
Encoding a decoded record again gives the same bytes, so a record read back from any store
is exactly what was written.
"""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import datetime
from typing import Any

from . import names
from .errors import ConfigError, ProtocolError

JOURNAL_FORMAT = "durable_agents.journal.v1"
SUPPORTED_FORMATS = (JOURNAL_FORMAT,)
HEADER_NAME = names.HEADER

# A caller-chosen run id; ids the engine derives (sessions, sub-runs) may also hold '>' and '/'.
_CALLER_RUN_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_DERIVED_RUN_ID = re.compile(r"[A-Za-z0-9_.:\-/>%]{1,400}")
# A derived id is caller-form parts joined by '>' and '/': none empty, none a path's '.' or
# '..' (an id read from an export file must not look like a path to anything that shows it).
_PARTS = re.compile(r"[/>]")
MAX_NAME_LENGTH = 500
# Control characters and lone surrogates: no step name holds them.
_BAD_NAME_CHARS = re.compile("[\x00-\x1f\ud800-\udfff]")

_ENCODER = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


def validate_run_id(run_id: object, *, derived: bool = False) -> str:
    """Return ``run_id`` if it is a valid run id, else raise ``ConfigError`` saying why."""
    pattern = _DERIVED_RUN_ID if derived else _CALLER_RUN_ID
    if (
        not isinstance(run_id, str)
        or not pattern.fullmatch(run_id)
        or (derived and any(part in ("", ".", "..") for part in _PARTS.split(run_id)))
    ):
        limit = (
            "1-400 characters of A-Za-z0-9_.:-/>%"
            if derived
            else ("1-200 characters of A-Za-z0-9_.:-")
        )
        raise ConfigError(
            f"invalid run id {run_id!r}: a run id is {limit}; "
            "pick an id from your own data (an order number, a ticket id)",
            code="config.run_id",
        )
    return run_id


def validate_step_name(name: object) -> str:
    """Return ``name`` if it can name a journal step, else raise ``ConfigError``."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"invalid step name {name!r}: a step name is a non-empty string of at most "
            f"{MAX_NAME_LENGTH} characters",
            code="config.step_name",
        )
    if _BAD_NAME_CHARS.search(name):
        raise ConfigError(
            f"invalid step name {name!r}: control characters and lone surrogates are not allowed",
            code="config.step_name",
        )
    return name


def is_reserved_name(name: str) -> bool:
    """Names starting with '@' belong to the engine (the header, internal bookkeeping)."""
    return name.startswith("@")


def _check(value: Any, path: str, _open: dict[int, str] | None = None) -> None:
    """Refuse values that would not round-trip exactly through JSON. ``_open``: the
    containers being walked (id -> path), to name a value that contains itself."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        _check_int(value, path)
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError(
                f"record value at {path} holds a lone surrogate, which is not valid UTF-8; "
                "clean the text before returning it",
                code="protocol.encoding",
            ) from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(
                f"record value at {path} is {value!r}, which JSON cannot hold; "
                "return a finite number or null",
                code="protocol.encoding",
            )
        return
    if isinstance(value, list | tuple | dict):
        _open = {} if _open is None else _open
        if id(value) in _open:
            raise ProtocolError(
                f"record value at {path} is the value at {_open[id(value)]} itself (it "
                "contains itself), which JSON cannot hold; return a copy without the loop",
                code="protocol.encoding",
            )
        _open[id(value)] = path
        try:
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ProtocolError(
                            f"record value at {path} has a non-string key {key!r}; JSON "
                            "object keys are strings, so convert it yourself to keep its "
                            "meaning",
                            code="protocol.encoding",
                        )
                    _check(key, f"{path} key")
                    _check(item, f"{path}.{key}", _open)
            else:
                for i, item in enumerate(value):
                    _check(item, f"{path}[{i}]", _open)
        finally:
            del _open[id(value)]  # the same value met again beside itself is no loop
        return
    raise ProtocolError(
        f"record value at {path} is a {type(value).__name__}, which JSON cannot hold; "
        "convert it to str, int, float, bool, None, list or dict first",
        code="protocol.encoding",
    )


def _check_int(value: int, path: str) -> None:
    """Refuse an int longer than Python writes as text (``sys.get_int_max_str_digits``)."""
    limit = sys.get_int_max_str_digits()
    magnitude = abs(value)
    # 3 bits a digit is an underestimate: a shorter int is surely within the limit.
    if not limit or magnitude.bit_length() <= 3 * limit or magnitude < 10**limit:
        return
    digits = max(limit + 1, int(magnitude.bit_length() * math.log10(2)))
    while magnitude >= 10**digits:  # counting up from an underestimate
        digits += 1
    raise ProtocolError(
        f"record value at {path} is an integer of {digits} digits, more than the {limit} "
        "Python writes as text; return it as a string",
        code="protocol.encoding",
    )


def refuse_nul(value: Any, what: str) -> None:
    """Refuse what a record refuses, and U+0000, for a value that also lands in a database
    column of its own (PostgreSQL's text and jsonb cannot hold U+0000; the journal's
    escaped JSON text can)."""

    def has_nul(v: Any) -> bool:
        if isinstance(v, str):
            return "\x00" in v
        if isinstance(v, dict):
            return any(has_nul(k) or has_nul(x) for k, x in v.items())
        if isinstance(v, list | tuple):
            return any(has_nul(x) for x in v)
        return False

    encode(value)  # everything else a record refuses, first
    if has_nul(value):
        raise ProtocolError(
            f"{what} holds the character U+0000, which the database cannot store; remove it first",
            code="protocol.encoding",
        )


_CONTAINERS = (dict, list, tuple)


def _string_keys(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """Whether every object key inside ``value`` is a string: the one thing ``_check``
    refuses that the JSON encoder would accept silently (it writes ``{1: x}`` as ``"1"``)."""
    if type(value) is dict or isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                return False
            if isinstance(item, _CONTAINERS) and not _string_keys(item):
                return False
        return True
    return all(not isinstance(item, _CONTAINERS) or _string_keys(item) for item in value)


def encode(value: Any) -> str:
    """The canonical JSON text of ``value``; ``ProtocolError`` if it does not encode exactly.

    The encoder itself refuses what JSON cannot hold (other types, NaN and infinities) and
    the UTF-8 check of the text finds lone surrogates; only non-string keys need a walk of
    the value. Any refusal is explained by ``_check``, which names the offending path. A
    value nested deeper than Python's recursion limit lets it walk is refused too: whatever
    a value is, the answer is text or a ``ProtocolError``, never another exception."""
    try:
        try:
            text = _ENCODER.encode(value)
            text.encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
            _check(value, "$")
            raise ProtocolError(  # not reached: _check refuses whatever the encoder refused
                f"record value cannot be written as JSON: {exc}", code="protocol.encoding"
            ) from None
        if isinstance(value, _CONTAINERS) and not _string_keys(value):
            _check(value, "$")
    except RecursionError:
        raise ProtocolError(
            "record value is nested too deeply to be written as JSON; flatten it (or "
            "return a summary) first",
            code="protocol.encoding",
        ) from None
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def decode(text: str) -> Any:
    """Decode journal text; ``ProtocolError`` on malformed data."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(
            f"journal entry is not valid JSON: {exc}", code="protocol.decode"
        ) from exc


class Record:
    """One journaled step, as read back: its name, commit position and canonical text.

    The body is decoded on first use: a resume reads a whole journal but decodes only the
    records it needs. Records are immutable.
    """

    __slots__ = ("_body", "created_at", "data", "name", "run_id", "seq")

    def __init__(
        self, run_id: str, name: str, seq: int, data: str, created_at: datetime | None = None
    ) -> None:
        self.run_id = run_id
        self.name = name
        self.seq = seq
        self.data = data
        self.created_at = created_at
        self._body: dict[str, Any] | None = None

    @property
    def body(self) -> dict[str, Any]:
        body = self._body
        if body is None:
            decoded = decode(self.data)
            if not isinstance(decoded, dict):
                raise ProtocolError(
                    f"journal entry {self.name!r} of run {self.run_id!r} is not a JSON object",
                    code="protocol.decode",
                )
            body = self._body = decoded
        return body

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        mine = (self.run_id, self.name, self.seq, self.data)
        return mine == (other.run_id, other.name, other.seq, other.data)

    def __hash__(self) -> int:
        return hash((self.run_id, self.name, self.seq))

    def __repr__(self) -> str:
        return f"Record({self.run_id!r}, {self.name!r}, seq={self.seq})"
