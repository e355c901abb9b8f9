"""``OpenAIChat``: the ``Model`` protocol over OpenAI Chat Completions, via the official SDK.

Promises:

* one ``chat.completions.create`` call per ``generate``, never retried by the SDK
  (``max_retries=0``): the engine retries, so every attempt's usage is accounted for;
* tool-call arguments are passed through verbatim, both ways: the engine journals and
  validates the model's own JSON text, never a re-serialisation of it;
* a cut-off (``length``) or filtered turn is returned, not raised, with ``finish`` set so
  the engine can refuse to journal it and still count its tokens;
* failures are ``ModelError`` with a stable code and ``retryable`` (see ``_errors``).

Works with any server that speaks Chat Completions (vLLM, Ollama, LiteLLM, Azure through
a ready ``client``): pass ``base_url``. Does not stream, does not send images, and drops
``Message.reasoning`` (Chat Completions has no way to send reasoning back). OpenAI has no
error flag on a tool result: the model reads a failure from the result's content.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    import openai
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "OpenAIChat needs the openai package: pip install 'durable-agents[openai]'"
    ) from exc

PROVIDER = _errors.Provider(
    name="OpenAI",
    adapter="OpenAIChat",
    key_env="OPENAI_API_KEY",
    console="the OpenAI dashboard (platform.openai.com, Settings > Limits / Billing)",
)

_FINISH = {
    "stop": FINISH_STOP,
    "tool_calls": FINISH_TOOL_CALLS,
    "function_call": FINISH_TOOL_CALLS,  # deprecated functions API
    "length": FINISH_LENGTH,
    "content_filter": FINISH_FILTERED,
}


class OpenAIChat:
    """A Chat Completions model. ``model_id`` is ``"openai:<model>"``.

    ``client`` takes a ready ``openai.OpenAI`` (or ``AzureOpenAI``) instead of
    ``api_key``/``base_url``/``timeout``; it is copied with ``max_retries=0``.
    ``max_tokens`` is sent as ``max_completion_tokens`` (reasoning models reject the
    deprecated ``max_tokens``); a server that only knows the old name can get it through
    ``extra_body={"max_tokens": ...}``. ``extra_body`` is merged into every request body.
    """

    # What a site's ``MODEL_RATES`` names this provider by (docs/limits.md).
    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.OpenAI | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float = 60.0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not model:
            raise ConfigError("OpenAIChat needs a model name, e.g. OpenAIChat('gpt-4.1-mini').")
        self.model = model
        self.model_id = f"openai:{model}"
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout = timeout
        self.extra_body = dict(extra_body) if extra_body else None
        self._api_key = api_key
        if client is not None:
            if api_key is not None or base_url is not None:
                raise ConfigError("Pass either client= or api_key=/base_url= to OpenAIChat.")
            self._client = client.with_options(max_retries=0)
            self._owns_client = False
        else:
            try:
                self._client = openai.OpenAI(
                    api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout
                )
            except openai.OpenAIError as exc:
                raise ConfigError(
                    "OpenAIChat has no API key: set OPENAI_API_KEY or pass api_key=.",
                    code="config.missing_api_key",
                ) from exc
            self._owns_client = True

    def __repr__(self) -> str:
        return f"OpenAIChat({self.model!r}, base_url={str(self._client.base_url)!r})"

    def close(self) -> None:
        """Close the HTTP connections of a client this adapter created."""
        if self._owns_client:
            self._client.close()

    def generate(self, request: ModelRequest) -> ModelResponse:
        kwargs: dict[str, Any] = {"model": self.model, "messages": to_wire_messages(request)}
        if request.tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": dict(t.parameters),
                    },
                }
                for t in request.tools
            ]
        if self.max_tokens is not None:
            kwargs["max_completion_tokens"] = self.max_tokens
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        try:
            completion = self._client.chat.completions.create(**kwargs)
        except openai.APIError as exc:
            raise self._translate(exc) from exc
        return from_wire(completion)

    def _translate(self, exc: openai.APIError) -> ModelError:
        if isinstance(exc, openai.APITimeoutError):
            return _errors.timeout_error(PROVIDER, timeout=self.timeout)
        if isinstance(exc, openai.APIConnectionError):
            return _errors.connection_error(
                PROVIDER, base_url=str(self._client.base_url), cause=exc.__cause__
            )
        if isinstance(exc, openai.APIStatusError):
            # The SDK unwraps {"error": {...}}: exc.body is the inner object, and exc.code /
            # exc.type carry e.g. "insufficient_quota" on a 429 that is not a rate limit.
            body = exc.body if isinstance(exc.body, Mapping) else {}
            said = body.get("message") if isinstance(body.get("message"), str) else None
            return _errors.status_error(
                PROVIDER,
                status=exc.status_code,
                markers=(exc.code, exc.type),
                provider_message=said,
                model=self.model,
                secrets=(self._api_key, self._client.api_key),
                headers=exc.response.headers,
            )
        return ModelError(
            f"OpenAI call failed: {_errors.redact(str(exc), (self._api_key,))}",
            code=_errors.FAILED,
            provider="openai",
        )


def to_wire_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for a request."""
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for m in request.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant"}
            if m.tool_calls:
                # content is null, not "", on a pure tool-call turn: that is how the API
                # itself returns it.
                msg["content"] = m.content or None
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            else:
                msg["content"] = m.content
            out.append(msg)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        else:
            raise ConfigError(f"OpenAIChat cannot send a message with role {m.role!r}.")
    return out


def from_wire(completion: Any) -> ModelResponse:
    """A ``ModelResponse`` from an SDK ``ChatCompletion``."""
    if not completion.choices:
        # Seen from OpenAI-compatible proxies that swallow an upstream error.
        raise _errors.invalid_response(PROVIDER, "no choices")
    choice = completion.choices[0]
    wire = choice.message
    calls = tuple(
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
        for c in wire.tool_calls or ()
        if c.type == "function"
    )
    raw_finish = choice.finish_reason or ""
    finish = _FINISH.get(raw_finish, FINISH_OTHER)
    content = wire.content or ""
    if calls and finish == FINISH_STOP:
        # Some compatible servers (older Ollama, vLLM) say "stop" on a tool-call turn.
        finish = FINISH_TOOL_CALLS
    refusal = getattr(wire, "refusal", None)
    if refusal and not content and not calls:
        # A structured refusal comes with finish_reason "stop"; it is not an answer.
        finish, content = FINISH_FILTERED, refusal
    return ModelResponse(
        message=Message(role="assistant", content=content, tool_calls=calls),
        usage=usage_from_wire(completion.usage),
        finish=finish,
        raw_finish=raw_finish,
        model=completion.model or "",
    )


def usage_from_wire(usage: Any) -> Usage:
    """Map ``CompletionUsage``. ``prompt_tokens`` includes the cached tokens: split them."""
    if usage is None:  # compatible servers may omit usage
        return Usage()
    prompt = usage.prompt_tokens or 0
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=usage.completion_tokens or 0,
        cache_read_tokens=cached,
    )
