"""Redaction of text that goes into the journal from a failing tool: URLs lose their
credentials, query values and fragments (hosts, paths and parameter names stay, so the
message is still useful)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
REDACTED = "REDACTED"


def _redact_url(match: re.Match[str]) -> str:
    url = match.group(0)
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(f"{k}={REDACTED}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    fragment = REDACTED if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_urls(text: str) -> str:
    return _URL.sub(_redact_url, text)


def error_text(exc: BaseException) -> str:
    """The text a model sees for a tool that raised: type and message, URLs redacted."""
    message = str(exc) or type(exc).__name__
    return redact_urls(f"{type(exc).__name__}: {message}")


def unknown_reason(exc: BaseException) -> dict[str, str]:
    """What a tool that raised ``ToolOutcomeUnknown`` said, kept for the person who resolves
    the halt: its type and message (URLs redacted, as in the text a model reads)."""
    return {"type": type(exc).__name__, "message": redact_urls(str(exc) or type(exc).__name__)}
