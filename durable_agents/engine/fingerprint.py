"""What an agent was when a run started: model id, each tool's schema hash, a hash of the
instructions, and one short hash over all of them. Code (a tool's body) is not part of it,
so changing only code never counts as a change.

A tool the site did not write (an MCP server's) is fingerprinted whole, as its source
declared it (``Tool.definition_digest``: its schema, description and annotations), and each
such source gets an entry of its own (``sources``: one digest over its tools), so that a
server whose tool list changed shows as drift naming the server."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from .model import Message, ToolSpec
from .records import encode


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tool_hash(spec: ToolSpec, definition: str | None = None) -> str:
    """The hash of what the model is shown of a tool; for a tool the site did not write,
    of its source's whole ``definition`` too (a Python tool's hash is unchanged by it)."""
    shown: dict[str, Any] = {"description": spec.description, "parameters": dict(spec.parameters)}
    if definition:
        shown["definition"] = definition
    return _sha(encode(shown))[:16]


def instructions_digest(instructions: str) -> str:
    return _sha("durable_agents.instructions\n" + instructions)[:16] if instructions else ""


def tools_digest(specs: Sequence[ToolSpec]) -> str:
    return digest_of_hashes({s.name: tool_hash(s) for s in specs})


def digest_of_hashes(hashes: Mapping[str, str]) -> str:
    """``tools_digest`` from each tool's hash (as a fingerprint's ``tools`` holds them)."""
    if not hashes:
        return ""
    parts = sorted(f"{name}:{h}" for name, h in hashes.items())
    return _sha("durable_agents.tools\n" + "\n".join(parts))[:16]


def fingerprint(
    model_id: str,
    instructions: str,
    specs: Sequence[ToolSpec],
    definitions: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """``definitions``: for each tool the site did not write, by name, its source (an MCP
    server's name) and its ``definition_digest``."""
    definitions = definitions or {}
    tools = {
        s.name: tool_hash(s, definitions[s.name][1] if s.name in definitions else None)
        for s in specs
    }
    parts: dict[str, Any] = {
        "model": model_id,
        "tools": tools,
        "instructions": instructions_digest(instructions),
    }
    by_source: dict[str, dict[str, str]] = {}
    for name, (source, digest) in definitions.items():
        by_source.setdefault(source, {})[name] = digest
    if by_source:
        parts["sources"] = {src: digest_of_hashes(hs) for src, hs in sorted(by_source.items())}
    return {**parts, "hash": _sha(encode(parts))[:12]}


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What changed between two fingerprints; empty when nothing did."""
    changes: dict[str, Any] = {}
    if old.get("hash") == new.get("hash"):
        return changes
    if old.get("model") != new.get("model"):
        changes["model"] = [old.get("model"), new.get("model")]
    old_tools, new_tools = dict(old.get("tools") or {}), dict(new.get("tools") or {})
    added = sorted(set(new_tools) - set(old_tools))
    removed = sorted(set(old_tools) - set(new_tools))
    changed = sorted(t for t in set(old_tools) & set(new_tools) if old_tools[t] != new_tools[t])
    if added:
        changes["tools_added"] = added
    if removed:
        changes["tools_removed"] = removed
    if changed:
        changes["tools_changed"] = changed
    if old.get("instructions") != new.get("instructions"):
        changes["instructions"] = True
    old_sources, new_sources = dict(old.get("sources") or {}), dict(new.get("sources") or {})
    sources = sorted(
        s for s in set(old_sources) | set(new_sources) if old_sources.get(s) != new_sources.get(s)
    )
    if sources:
        changes["sources_changed"] = sources
    return changes


def prompt_digest(instructions: str, messages: Sequence[Message]) -> str:
    """Digest of what a turn was sent as instructions (the system prompt)."""
    del messages  # the transcript is in the journal; the digest pins the instructions
    return instructions_digest(instructions)
