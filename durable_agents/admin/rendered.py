"""A call's arguments as a person reads them, for the inbox's cards and the call's page.

Each argument under its schema title, in the schema's order (not the database's: PostgreSQL
orders a JSON object's keys by length, which can put a padded ``memo`` before the
``payee``), except that the arguments the tool names as identifying the call
(``@tool(identifying=[...])``) come first; text with its line breaks; lists as lists; objects
as nested fields; numbers grouped; yes/no for booleans. Text is a value, never a field:
short text is drawn quoted, and *free text* (several lines, or longer than ``FREE_TEXT``
characters) in a quoted, bordered box that says it is free text and how long, so a memo
whose first line reads "Payee: ACME Supplies GmbH" cannot pass for the payee. A long value
is *folded*: its start is shown and the rest is counted ("… 4,812 more characters"). A
rendering with anything folded says so (``Shown.folded``), and whoever shows it must not
offer a decision until the person has seen it whole: a decision is for the whole arguments,
never for the part on screen.

Rendering never fails and never hides an argument: what the schema does not know is shown
after what it does, under its own name; what is too deep to lay out is shown as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .answerform import resolve_ref

TEXT_FOLD = 400  # characters of a text shown while folded
LINES_FOLD = 8  # lines of a text shown while folded
LIST_FOLD = 10  # items of a list shown while folded
DEPTH = 4  # nesting laid out as fields; deeper values are shown as JSON text
FREE_TEXT = 80  # text longer than this (or on several lines) is drawn as free text


@dataclass
class Node:
    """One value: ``kind`` is text, number, flag, none, list or object. ``text`` is what is
    shown of a scalar (the start of a folded text); ``items`` / ``fields`` what is shown of
    a list / object; ``hidden`` what folding left out (characters, or items)."""

    kind: str
    text: str = ""
    items: list[Node] = field(default_factory=list)
    fields: list[Field] = field(default_factory=list)
    hidden: int = 0
    free: bool = False  # text on several lines or longer than FREE_TEXT: drawn boxed
    length: int = 0  # characters of the whole text
    lines: int = 1  # lines of the whole text

    @property
    def hidden_words(self) -> str:
        unit = "item" if self.kind == "list" else "character"
        return f"{self.hidden:,} more {unit}{'s' if self.hidden != 1 else ''}"

    @property
    def length_words(self) -> str:
        """``"1,712 characters on 31 lines"``: how much free text there is, in all."""
        across = f" on {self.lines:,} lines" if self.lines > 1 else ""
        return f"{self.length:,} character{'s' if self.length != 1 else ''}{across}"


@dataclass
class Field:
    title: str
    key: str
    node: Node
    description: str = ""
    identifying: bool = False  # the tool names it as saying what the call is about


@dataclass
class Shown:
    fields: list[Field]
    folded: bool  # some value is cut: show it whole before any decision


def render(schema: Any, arguments: Any, *, whole: bool = False, first: Sequence[str] = ()) -> Shown:
    """``arguments`` laid out for a person under ``schema`` (a tool's JSON schema, or None),
    the arguments named in ``first`` (a tool's ``identifying``) first, in that order. Folded
    unless ``whole``."""
    state = _State(whole=whole)
    root = schema if isinstance(schema, Mapping) else {}
    if isinstance(arguments, Mapping):
        fields = _fields(root, root, arguments, state, 0, first)
    else:  # not an object: one unnamed value
        fields = [Field("Value", "", _node(root, root, arguments, state, 0, ""))]
    return Shown(fields=fields, folded=state.folded)


def identifying_of(tool: Any) -> tuple[str, ...]:
    """The arguments ``tool`` names as identifying its calls (``@tool(identifying=...)``);
    none for a tool that is gone from the code."""
    return tuple(getattr(tool, "identifying", ()) or ())


@dataclass
class _State:
    whole: bool
    folded: bool = False


def in_schema_order(schema: Any, arguments: Any, first: Sequence[str] = ()) -> Any:
    """``arguments`` with the keys of ``first`` first, then the rest in the schema's order,
    then the others: for JSON shown to a person (a list cell), so what identifies the call,
    then what the schema puts first, is read first."""
    if not isinstance(arguments, Mapping):
        return arguments
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    return {k: arguments[k] for k in _order(props, arguments, first)}


def _order(props: Mapping[str, Any], value: Mapping[str, Any], first: Sequence[str]) -> list[str]:
    keys = [str(k) for k in first if k in value]
    keys += [str(k) for k in props if k in value and k not in keys]
    return keys + [str(k) for k in value if k not in keys]


def _title(key: str, spec: Any) -> str:
    title = spec.get("title") if isinstance(spec, Mapping) else None
    return str(title or key.replace("_", " ").strip().capitalize() or key)


def _fields(
    node: Mapping[str, Any],
    root: Mapping[str, Any],
    value: Mapping[str, Any],
    state: _State,
    depth: int,
    first: Sequence[str] = (),
) -> list[Field]:
    props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
    assert isinstance(props, Mapping)
    out = []
    for key in _order(props, value, first):
        spec = resolve_ref(props.get(key) or {}, root)
        description = spec.get("description") if isinstance(spec, Mapping) else ""
        out.append(
            Field(
                _title(key, spec),
                key,
                _node(spec, root, value[key], state, depth + 1, key),
                str(description or ""),
                identifying=key in first,
            )
        )
    return out


def _node(
    spec: Any, root: Mapping[str, Any], value: Any, state: _State, depth: int, key: str
) -> Node:
    spec = spec if isinstance(spec, Mapping) else {}
    if value is None:
        return Node("none", "none")
    if isinstance(value, bool):
        return Node("flag", "yes" if value else "no")
    if isinstance(value, int | float):
        return Node("number", _number(value, key))
    if isinstance(value, str):
        return _text(value, state)
    if depth >= DEPTH:
        return _text(json.dumps(value, ensure_ascii=False, indent=2), state)
    if isinstance(value, list):
        item_spec = resolve_ref(spec.get("items") or {}, root)
        shown = value if state.whole else value[:LIST_FOLD]
        if len(shown) < len(value):
            state.folded = True
        items = [_node(item_spec, root, v, state, depth + 1, key) for v in shown]
        return Node("list", items=items, hidden=len(value) - len(shown))
    if isinstance(value, Mapping):
        return Node("object", fields=_fields(spec, root, value, state, depth))
    return _text(str(value), state)


def _text(value: str, state: _State) -> Node:
    count = value.count("\n") + 1
    free = count > 1 or len(value) > FREE_TEXT
    if state.whole:
        return Node("text", value, free=free, length=len(value), lines=count)
    cut = len(value)
    if cut > TEXT_FOLD:
        cut = TEXT_FOLD
    lines = value[:cut].split("\n")
    if len(lines) > LINES_FOLD:
        cut = len("\n".join(lines[:LINES_FOLD]))
    if cut < len(value):
        state.folded = True
    return Node(
        "text", value[:cut], hidden=len(value) - cut, free=free, length=len(value), lines=count
    )


def _number(value: int | float, key: str) -> str:
    """Grouped (``12,500``), except what names a thing rather than counts it: an ``id``, a
    ``year``, a ``code`` or a ``number`` field keeps its digits as they are."""
    lowered = key.lower()
    if lowered.endswith(("id", "ids", "year", "code", "number", "no")):
        return json.dumps(value)
    return f"{value:,}"
