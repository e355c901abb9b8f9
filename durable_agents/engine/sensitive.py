"""Sensitive argument values in exports and audit bundles (docs/audit.md).

A tool names argument fields ``sensitive`` (``@tool(sensitive=["card_number"])``). An
export or a bundle of a run shows, in place of each value such a field took in the run, a
salted hash::

    "sensitive:" + HMAC-SHA256(key, run_id ‖ 0x00 ‖ where ‖ 0x00 ‖ field ‖ 0x00 ‖ value)

where ``key`` derives from a site secret, ``where`` is the record or row the value appears
in and ``value`` its canonical JSON: equal values in two runs (or two records) do not show
as equal, and nobody without the site's secret can test a guess against the marker.

The values are found where the run's tool calls hold them (the model's calls, approval
requests, edited approvals, halts), then replaced wherever they appear in the exported
data: as a whole JSON value, and inside any text (the model's raw argument text, a tool
result that echoes it). Inside text, only values of four characters or more are replaced.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import ProtocolError
from .records import decode, encode

PREFIX = "sensitive:"
_DOMAIN = b"durable_agents.sensitive.v1"
_MIN_TEXT = 4


def derive_key(secret: str) -> bytes:
    """The HMAC key of the markers, from the site's secret."""
    return hmac.new(secret.encode("utf-8"), _DOMAIN, hashlib.sha256).digest()


def marker(key: bytes, run_id: str, where: str, field: str, value: Any) -> str:
    """The salted hash shown in place of ``value``."""
    message = "\x00".join((run_id, where, field, encode(value))).encode("utf-8")
    return PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


def _arguments(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, str):
        try:
            value = decode(value or "{}")
        except ProtocolError:
            return None
    return value if isinstance(value, Mapping) else None


class Redactor:
    """Finds a run's sensitive values, then hides them in the data of an export."""

    def __init__(self, key: bytes, run_id: str, sensitive: Mapping[str, Sequence[str]]) -> None:
        self.key = key
        self.run_id = run_id
        self.sensitive = {name: tuple(fields) for name, fields in sensitive.items() if fields}
        self._found: dict[str, tuple[str, Any]] = {}  # canonical value -> (field, value)

    @property
    def active(self) -> bool:
        """Whether the run holds any sensitive value (an export of it is then redacted)."""
        return bool(self._found)

    def collect_call(self, tool_name: Any, arguments: Any) -> None:
        """Note the sensitive values of one call of ``tool_name`` (arguments as a mapping or
        as the model's JSON text)."""
        fields = self.sensitive.get(str(tool_name), ())
        args = _arguments(arguments) if fields else None
        if args is None:
            return
        for name in fields:
            if name in args and args[name] is not None:
                self._found.setdefault(encode(args[name]), (name, args[name]))

    def collect_record(self, data: str) -> None:
        """Note the sensitive values of the tool calls a model record holds."""
        if not self.sensitive:
            return
        try:
            body = decode(data)
        except ProtocolError:
            return
        message = body.get("message") if isinstance(body, Mapping) else None
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, Mapping):
                self.collect_call(call.get("name"), call.get("arguments"))

    def redact(self, where: str, value: Any) -> Any:
        """``value`` with every sensitive value replaced by its marker for ``where``."""
        if not self._found:
            return value
        return self._walk(where, value, self._pairs(where))

    def redact_text(self, where: str, text: str) -> str:
        """Canonical JSON text, redacted (the same text when nothing was hidden)."""
        if not self._found:
            return text
        return encode(self.redact(where, decode(text)))

    def _pairs(self, where: str) -> list[tuple[str, Any, str]]:
        out = [
            (canonical, value, marker(self.key, self.run_id, where, field, value))
            for canonical, (field, value) in self._found.items()
        ]
        out.sort(key=lambda p: len(p[0]), reverse=True)  # the longest first
        return out

    def _walk(self, where: str, value: Any, pairs: list[tuple[str, Any, str]]) -> Any:
        if isinstance(value, Mapping):
            return {k: self._walk(where, v, pairs) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(where, v, pairs) for v in value]
        canonical = encode(value)
        for known, _, mark in pairs:
            if canonical == known:
                return mark
        if isinstance(value, str):
            for known, original, mark in pairs:
                for text in _forms(known, original):
                    if len(text) >= _MIN_TEXT and text in value:
                        value = value.replace(text, mark)
        return value


def _forms(canonical: str, value: Any) -> Iterable[str]:
    """How a value can appear inside text: itself, and as escaped inside a JSON string."""
    if isinstance(value, str):
        yield value
        escaped = canonical[1:-1]
        if escaped != value:
            yield escaped
        if encode(escaped)[1:-1] != escaped:
            yield encode(escaped)[1:-1]  # inside JSON text inside a JSON string
    else:
        yield canonical
