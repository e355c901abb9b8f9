"""The shape of an answer a person gives to an interrupt: a JSON schema, and the check of a
value against it.

An interrupt's schema is journaled with its question, so whoever answers (the admin, the
API, a Python call in another process) checks the answer against the same schema the tool
asked with, without importing the tool's code. A pydantic model given as the schema is
journaled as its JSON schema; the tool gets the answer back as an instance of the model.

The check covers the JSON-schema keywords pydantic emits and a hand-written schema
commonly uses (``type``, ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``,
``pattern``, ``minimum``/``maximum`` and their exclusive forms, ``anyOf``/``oneOf``/``allOf``,
local ``$ref``); annotations (``title``, ``description``, ``default``, ``examples``,
``format``) are not checked. A schema using any other keyword is refused when the tool asks,
never silently half-checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pydantic

from .errors import WaitError

_CHECKED = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
    }
)
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "format", "$schema", "$id", "$comment"}
)


def schema_of(schema: Any) -> dict[str, Any] | None:
    """The JSON schema of ``schema`` (a pydantic model class, a JSON schema dict or None),
    refused (``ConfigError``) if it uses a keyword this check does not cover."""
    if schema is None:
        return None
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        out = schema.model_json_schema()
    elif isinstance(schema, Mapping):
        out = dict(schema)
    else:
        raise WaitError(
            f"an interrupt's schema is a pydantic model class or a JSON schema dict, not "
            f"{type(schema).__name__}",
            code="config.wait_schema",
        )
    _check_keywords(out, "schema")
    return out


def _check_keywords(node: Any, where: str) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, Mapping):
        raise WaitError(f"{where}: a schema is an object", code="config.wait_schema")
    unknown = sorted(set(node) - _CHECKED - _ANNOTATIONS)
    if unknown:
        raise WaitError(
            f"{where}: JSON-schema keyword(s) {', '.join(unknown)} are not checked by "
            "durable_agents; use a pydantic model or the keywords listed in docs/waiting.md",
            code="config.wait_schema",
        )
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (node.get(key) or {}).items():
            _check_keywords(sub, f"{where}.{key}.{name}")
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(node.get(key) or ()):
            _check_keywords(sub, f"{where}.{key}[{i}]")
    for key in ("items", "additionalProperties"):
        if key in node and not isinstance(node[key], bool):
            _check_keywords(node[key], f"{where}.{key}")


def problems(schema: Mapping[str, Any] | None, value: Any) -> list[str]:
    """What is wrong with ``value`` for ``schema`` (an empty list: nothing)."""
    if schema is None:
        return []
    out: list[str] = []
    _check(schema, value, "answer", schema, out)
    return out


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
}


def _resolve(ref: str, root: Mapping[str, Any]) -> Any:
    if not ref.startswith("#/"):
        raise WaitError(f"only local $ref is supported, not {ref!r}", code="config.wait_schema")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _check(schema: Any, value: Any, at: str, root: Mapping[str, Any], out: list[str]) -> None:
    if schema is True or schema is None:
        return
    if schema is False:
        out.append(f"{at}: not allowed")
        return
    if "$ref" in schema:
        _check(_resolve(schema["$ref"], root), value, at, root, out)
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: False)(value) for k in kinds):
            out.append(f"{at}: expected {' or '.join(kinds)}, got {_json_type(value)}")
            return
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{at}: must be one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{at}: must be {schema['const']!r}")
    for key in ("anyOf", "oneOf"):
        if key in schema and not any(not problems_at(s, value, root) for s in schema[key]):
            out.append(f"{at}: matches none of the allowed shapes")
    for sub in schema.get("allOf") or ():
        _check(sub, value, at, root, out)
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(f"{at}: at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{at}: at most {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{at}: must match {schema['pattern']!r}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{at}: at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{at}: at most {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{at}: more than {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            out.append(f"{at}: less than {schema['exclusiveMaximum']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{at}: at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(f"{at}: at most {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                _check(schema["items"], item, f"{at}[{i}]", root, out)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                out.append(f"{at}.{name}: required")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                _check(props[name], item, f"{at}.{name}", root, out)
            elif extra is False:
                out.append(f"{at}.{name}: not allowed")
            elif isinstance(extra, Mapping):
                _check(extra, item, f"{at}.{name}", root, out)


def problems_at(schema: Any, value: Any, root: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    _check(schema, value, "answer", root, out)
    return out


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__
