"""Values shown to people as JSON: indented, non-ASCII kept as itself."""

from __future__ import annotations

import json
from typing import Any


def pretty(value: Any) -> str:
    """JSON for people: indented, non-ASCII kept as itself."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def pretty_text(text: Any) -> str:
    """A JSON text (tool call arguments are sent as text) pretty-printed, or as it is."""
    if not isinstance(text, str):
        return pretty(text)
    try:
        return pretty(json.loads(text))
    except ValueError:
        return text
