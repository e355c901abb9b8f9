"""``AnthropicMessages``: the ``Model`` protocol over the Anthropic Messages API (official SDK).

Promises:

* one ``messages.create`` per ``generate``, never retried by the SDK (``max_retries=0``):
  the engine retries, so every attempt's usage is accounted for;
* thinking blocks (``thinking`` with its ``signature``, ``redacted_thinking``) are kept in
  ``Message.reasoning`` as plain JSON and sent back unchanged, as the API requires when
  thinking is combined with tools;
* the tool results of a turn go back as ONE user message of ``tool_result`` blocks, in
  order, with ``is_error`` set on failures;
* a cut-off (``length``) or refused turn is returned, not raised, with ``finish`` set so
  the engine can refuse to journal it and still count its tokens;
* failures are ``ModelError`` with a stable code and ``retryable`` (see ``_errors``).

Does not stream, send images or documents, or keep server-tool blocks (web search, code
execution). Tool-call arguments are the compact UTF-8 JSON text of the block's ``input``
(the API returns an object, not text). A turn's thinking blocks are sent before its text
and tool calls, so interleaved thinking does not keep its position between tool calls.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from durable_agents.engine.errors import ConfigError, ModelError
from durable_agents.engine.model import (
    FINISH_FILTERED,
    FINISH_LENGTH,
    FINISH_OTHER,
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)

from . import _errors

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "AnthropicMessages needs the anthropic package: pip install 'durable-agents[anthropic]'"
    ) from exc

PROVIDER = _errors.Provider(
    name="Anthropic",
    adapter="AnthropicMessages",
    key_env="ANTHROPIC_API_KEY",
    console="the Claude Console (console.anthropic.com, Settings > Limits / Billing)",
)

_FINISH = {
    "end_turn": FINISH_STOP,
    "stop_sequence": FINISH_STOP,
    "tool_use": FINISH_TOOL_CALLS,
    "max_tokens": FINISH_LENGTH,
    "model_context_window_exceeded": FINISH_LENGTH,
    "refusal": FINISH_FILTERED,
    # "pause_turn" (a server tool paused a long turn) has no neutral meaning: other.
}
_REASONING_TYPES = frozenset({"thinking", "redacted_thinking"})


class AnthropicMessages:
    """A Messages API model. ``model_id`` is ``"anthropic:<model>"``.

    ``thinking`` is passed through as the request's ``thinking`` parameter, e.g.
    ``{"type": "enabled", "budget_tokens": 1024}`` or ``{"type": "adaptive"}``;
    ``max_tokens`` must then exceed any budget. ``client`` takes a ready
    ``anthropic.Anthropic`` (or Bedrock/Vertex client) instead of
    ``api_key``/``base_url``/``timeout``; it is copied with ``max_retries=0``.

    ``temperature`` is sent only by an SDK that still takes it. anthropic 2.x speaks API
    version 2026-10-21, which answers 400 to any sampling parameter at any value, and has
    dropped the argument: with it a ``temperature`` is a ``ConfigError`` here, once, rather
    than a failed request on every turn.
    """

    # What a site's ``MODEL_RATES`` names this provider by (docs/limits.md).
    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: anthropic.Anthropic | None = None,
        max_tokens: int = 4096,
        temperature: float | None = None,
        thinking: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not model:
            raise ConfigError(
                "AnthropicMessages needs a model name, e.g. AnthropicMessages('claude-sonnet-4-6')."
            )
        if temperature is not None and not _sdk_takes("temperature"):
            raise ConfigError(
                f"AnthropicMessages cannot set temperature with anthropic {anthropic.__version__}: "
                f"the API version this SDK speaks rejects sampling parameters. Leave "
                f"temperature unset."
            )
        self.model = model
        self.model_id = f"anthropic:{model}"
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.thinking = dict(thinking) if thinking else None
        self.timeout = timeout
        self._api_key = api_key
        if client is not None:
            if api_key is not None or base_url is not None:
                raise ConfigError("Pass either client= or api_key=/base_url= to AnthropicMessages.")
            self._client = client.with_options(max_retries=0)
            self._owns_client = False
        else:
            # An explicit timeout also switches off the SDK's refusal of non-streaming calls
            # whose max_tokens could take over ten minutes to generate.
            try:
                self._client = anthropic.Anthropic(
                    api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
                )
            except anthropic.AnthropicError as exc:  # a named profile that does not load
                raise _no_credentials(str(exc)) from exc
            self._owns_client = True
            # Besides the key the SDK finds tokens, profiles and workload identity, and only
            # notices that none is there when it sends, as a TypeError: check now.
            creds = ("api_key", "auth_token", "credentials")
            if not any(getattr(self._client, c, None) for c in creds):
                self._client.close()
                raise _no_credentials("")

    def __repr__(self) -> str:
        return f"AnthropicMessages({self.model!r}, base_url={str(self._client.base_url)!r})"

    def close(self) -> None:
        """Close the HTTP connections of a client this adapter created."""
        if self._owns_client:
            self._client.close()

    def generate(self, request: ModelRequest) -> ModelResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": to_wire_messages(request.messages),
        }
        if request.instructions:
            kwargs["system"] = request.instructions
        if request.tools:
            kwargs["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                for t in request.tools
            ]
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.thinking is not None:
            kwargs["thinking"] = self.thinking
        try:
            message = self._client.messages.create(**kwargs)
        except anthropic.APIError as exc:
            raise self._translate(exc) from exc
        return from_wire(message)

    def _translate(self, exc: anthropic.APIError) -> ModelError:
        if isinstance(exc, anthropic.APITimeoutError):
            return _errors.timeout_error(PROVIDER, timeout=self.timeout)
        if isinstance(exc, anthropic.APIConnectionError):
            return _errors.connection_error(
                PROVIDER, base_url=str(self._client.base_url), cause=exc.__cause__
            )
        if isinstance(exc, anthropic.APIStatusError):
            # The body is {"type": "error", "error": {"type": ..., "message": ...,
            # "details": {"error_code": ...}}}; read it directly, older SDKs do not lift it.
            body = exc.body if isinstance(exc.body, Mapping) else {}
            error = body.get("error")
            error = error if isinstance(error, Mapping) else {}
            details = error.get("details")
            error_code = details.get("error_code") if isinstance(details, Mapping) else None
            said = error.get("message")
            return _errors.status_error(
                PROVIDER,
                status=exc.status_code,
                markers=(_str(error.get("type")), _str(error_code)),
                provider_message=_str(said),
                model=self.model,
                secrets=(self._api_key, getattr(self._client, "api_key", None)),
                headers=exc.response.headers,
            )
        return ModelError(
            f"Anthropic call failed: {_errors.redact(str(exc), (self._api_key,))}",
            code=_errors.FAILED,
            provider="anthropic",
        )


def to_wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The Messages API ``messages`` for a transcript.

    Consecutive tool results become one user message, and a user text that follows them
    joins that message after its ``tool_result`` blocks: the API wants every result of a
    turn in the user message right after it, results first.
    """
    out: list[dict[str, Any]] = []

    def add_user_blocks(blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == "user":
            last = out[-1]
            if isinstance(last["content"], str):
                last["content"] = [{"type": "text", "text": last["content"]}]
            last["content"].extend(blocks)
        else:
            out.append({"role": "user", "content": blocks})

    for m in messages:
        if m.role == "user":
            if out and out[-1]["role"] == "user":
                add_user_blocks([{"type": "text", "text": m.content}])
            else:
                out.append({"role": "user", "content": m.content})
        elif m.role == "tool":
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content,
                "is_error": m.is_error,
            }
            add_user_blocks([block])
        elif m.role == "assistant":
            out.append({"role": "assistant", "content": _assistant_blocks(m)})
        else:
            raise ConfigError(f"AnthropicMessages cannot send a message with role {m.role!r}.")
    return out


def _no_credentials(why: str) -> ConfigError:
    because = f" ({_errors.redact(why)})" if why else ""
    return ConfigError(
        f"AnthropicMessages has no credentials{because}: set ANTHROPIC_API_KEY or pass api_key=.",
        code="config.missing_api_key",
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _sdk_takes(param: str) -> bool:
    from anthropic.resources.messages import Messages

    return param in inspect.signature(Messages.create).parameters


def _assistant_blocks(m: Message) -> list[dict[str, Any]]:
    # Reasoning blocks go back exactly as received: the API checks each signature.
    blocks: list[dict[str, Any]] = [dict(r) for r in m.reasoning]
    if m.content:
        blocks.append({"type": "text", "text": m.content})
    for c in m.tool_calls:
        blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)})
    return blocks


def _input(call: ToolCall) -> Any:
    # The engine never sends back invalid arguments (it records an error result instead),
    # and the API only accepts an object here.
    try:
        value = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def from_wire(message: Any) -> ModelResponse:
    """A ``ModelResponse`` from an SDK ``Message``."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            arguments = json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
        elif block.type in _REASONING_TYPES:
            reasoning.append(block.model_dump(mode="json", exclude_none=True))
    raw_finish = message.stop_reason or ""
    return ModelResponse(
        message=Message(
            role="assistant",
            content="".join(texts),
            tool_calls=tuple(calls),
            reasoning=tuple(reasoning),
        ),
        usage=usage_from_wire(message.usage),
        finish=_FINISH.get(raw_finish, FINISH_OTHER),
        raw_finish=raw_finish,
        model=message.model or "",
    )


def usage_from_wire(usage: Any) -> Usage:
    """Map ``Usage``. Unlike OpenAI, ``input_tokens`` already excludes cache reads/writes."""
    if usage is None:
        return Usage()
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=usage.cache_read_input_tokens or 0,
        cache_write_tokens=usage.cache_creation_input_tokens or 0,
    )
