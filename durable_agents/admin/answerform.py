"""A form for a person's answer, generated from the JSON schema the tool asked with.

The form is a convenience, not the check: it turns the fields back into one JSON value, and
``answer_interrupt`` checks that value against the journaled schema, whatever the form let
through (its problems are shown on the form, and nothing is recorded). So the form covers
the common shapes and falls back to a JSON text box for the rest:

* an object with ``properties``: one field per property (required as the schema says);
* a choice (``enum``, ``const``, ``boolean``): a select, with nothing chosen at first;
* ``integer`` / ``number`` / ``string``: a number or text input;
* anything else (arrays, nested objects, ``anyOf`` other than "X or null", no schema): JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django import forms

from .base import json_field

ANSWER = "value"  # the field of a form whose whole answer is one value
_NOTHING = ""  # a select's "no answer" (optional fields)


def field_name(prop: str) -> str:
    """The form field of the answer's property ``prop``."""
    return f"a-{prop}"


def resolve_ref(node: Any, root: Mapping[str, Any]) -> Any:
    """Follow a local ``$ref`` (what pydantic emits for enums and nested models)."""
    seen = 0
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and seen < 20:
        ref = str(node["$ref"])
        if not ref.startswith("#/"):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        if target is None:
            return node
        node, seen = target, seen + 1
    return node


def _nullable(node: Mapping[str, Any], root: Mapping[str, Any]) -> tuple[Any, bool]:
    """``X or null`` (pydantic's ``Optional[X]``) → (X, True)."""
    options = node.get("anyOf") or node.get("oneOf")
    if isinstance(options, list) and len(options) == 2:
        rest = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
        if len(rest) == 1:
            return resolve_ref(rest[0], root), True
    return node, False


def _choices(node: Mapping[str, Any]) -> list[Any] | None:
    if isinstance(node.get("enum"), list) and all(
        isinstance(v, str | int | float | bool) or v is None for v in node["enum"]
    ):
        return list(node["enum"])
    if "const" in node:
        return [node["const"]]
    if node.get("type") == "boolean":
        return [True, False]
    return None


def _shown(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value) if isinstance(value, str) else json.dumps(value)


def _field(node: Any, root: Mapping[str, Any], label: str, required: bool) -> forms.Field:
    node = resolve_ref(node, root)
    node, nullable = _nullable(node, root) if isinstance(node, Mapping) else (node, False)
    required = required and not nullable
    if not isinstance(node, Mapping):
        return JsonField(label=label, required=required)
    help_text = str(node.get("description") or "")
    label = str(node.get("title") or label)
    options = _choices(node)
    if options is not None:
        choices = [(json.dumps(v), _shown(v)) for v in options]
        # Nothing is chosen until the person chooses: a preselected first answer would be
        # given by one careless click (an exception granted, a refund confirmed).
        choices.insert(0, (_NOTHING, "— choose —" if required else "— (no answer)"))
        return forms.TypedChoiceField(
            label=label,
            help_text=help_text,
            required=required,
            choices=choices,
            coerce=json.loads,
            empty_value=None,
        )
    kind = node.get("type")
    common: dict[str, Any] = {"label": label, "help_text": help_text, "required": required}
    if kind == "integer":
        return forms.IntegerField(**common)
    if kind == "number":
        return forms.FloatField(**common)
    if kind == "string":
        max_length = node.get("maxLength")
        return forms.CharField(
            **common,
            strip=False,
            max_length=max_length if isinstance(max_length, int) else None,
            widget=forms.TextInput(attrs={"size": 50}),
        )
    return JsonField(**common)


class JsonField(forms.CharField):
    """Any JSON value, typed as text (an empty optional field is no answer)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 4, "cols": 60}))
        kwargs["help_text"] = " ".join(p for p in (kwargs.get("help_text") or "", "As JSON.") if p)
        super().__init__(**kwargs)

    def clean(self, value: Any) -> Any:
        text = super().clean(value)
        if not str(text).strip():
            return None
        return json_field(str(text), str(self.label or "The answer"))


class AnswerForm(forms.Form):
    """The answer to one interrupt, with fields generated from its JSON schema."""

    def __init__(self, schema: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        root = schema if isinstance(schema, Mapping) else {}
        node = resolve_ref(root, root) if root else None
        self.properties: list[str] | None = None
        props = node.get("properties") if isinstance(node, Mapping) else None
        if (
            isinstance(node, Mapping)
            and node.get("type", "object") == "object"
            and isinstance(props, Mapping)
            and props
        ):
            required = set(node.get("required") or ())
            self.properties = [str(p) for p in props]
            for prop in self.properties:
                self.fields[field_name(prop)] = _field(props[prop], root, prop, prop in required)
        elif node is None:
            self.fields[ANSWER] = JsonField(label="Answer")
        else:
            self.fields[ANSWER] = _field(node, root, "Answer", True)

    def value(self) -> Any:
        """The answer the cleaned fields make (call after ``is_valid``)."""
        data = self.cleaned_data
        if self.properties is None:
            return data.get(ANSWER)
        out: dict[str, Any] = {}
        for prop in self.properties:
            got = data.get(field_name(prop))
            field = self.fields[field_name(prop)]
            # An optional field left empty is no answer to that property, not a null.
            if not field.required and got in (None, ""):
                continue
            out[prop] = got
        return out
