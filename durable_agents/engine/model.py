"""What the loop says to a model and what it gets back: provider-neutral types.

Adapters in ``durable_agents.providers`` translate these to and from a provider's wire
format. Everything here converts to plain JSON (``to_json``/``from_json``) because a model
response is journaled before any of its tools run, and replayed from the journal on resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["user", "assistant", "tool"]

# Why a model turn ended, normalised across providers.
FINISH_STOP = "stop"  # the model finished its answer
FINISH_TOOL_CALLS = "tool_calls"  # the model asked for tools
FINISH_LENGTH = "length"  # cut at the output token limit: not an answer
FINISH_FILTERED = "filtered"  # stopped by a content filter or refusal: not an answer
FINISH_OTHER = "other"


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant turn. ``arguments`` is the JSON text the model sent."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(id=str(data["id"]), name=str(data["name"]), arguments=str(data["arguments"]))


@dataclass(frozen=True)
class Message:
    """One message of a transcript.

    * user: ``content``.
    * assistant: ``content`` (may be empty) and ``tool_calls``; ``reasoning`` holds opaque
      provider blocks (Anthropic thinking blocks with their signatures) that must be sent
      back unchanged on the next request.
    * tool: the result of call ``tool_call_id`` (tool ``name``), ``content`` being the
      result's JSON text, ``is_error`` marking a failure the model should read as such.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    reasoning: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            data["name"] = self.name
        if self.is_error:
            data["is_error"] = True
        if self.reasoning:
            data["reasoning"] = [dict(r) for r in self.reasoning]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        return cls(
            role=data["role"],
            content=str(data.get("content") or ""),
            tool_calls=tuple(ToolCall.from_json(c) for c in data.get("tool_calls") or ()),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            is_error=bool(data.get("is_error", False)),
            reasoning=tuple(dict(r) for r in data.get("reasoning") or ()),
        )


@dataclass(frozen=True)
class Usage:
    """Token counts of one or more model requests."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Usage:
        if not data:
            return cls()
        return cls(
            int(data.get("input_tokens", 0)),
            int(data.get("output_tokens", 0)),
            int(data.get("cache_read_tokens", 0)),
            int(data.get("cache_write_tokens", 0)),
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """One request: the instructions (system prompt), the transcript and the tools."""

    instructions: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()


@dataclass(frozen=True)
class ModelResponse:
    """One assistant turn, with what it cost and why it ended."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    finish: str = FINISH_STOP
    raw_finish: str = ""
    model: str = ""


@runtime_checkable
class Model(Protocol):
    """A model adapter. ``model_id`` names the model for the agent fingerprint.

    ``generate`` returns one assistant turn or raises ``ModelError`` with ``retryable`` set
    for rate limits, 5xx and timeouts, and unset for auth, validation and quota errors.
    Adapters do not retry: the loop does, so every attempt's usage is accounted for.
    """

    model_id: str

    def generate(self, request: ModelRequest) -> ModelResponse: ...
