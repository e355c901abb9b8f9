"""Turn a provider's failure into a ``ModelError`` with a stable code and a retry verdict.

Both adapters funnel their SDK exceptions through here so the same HTTP status means the
same thing whichever provider answered. The codes are part of the public contract:

============================  =========  ==================================================
code                          retryable  when
============================  =========  ==================================================
``model.rate_limited``        yes        HTTP 429 (requests or tokens per minute)
``model.quota_exhausted``     no         HTTP 402, OpenAI ``insufficient_quota`` (sent as a
                                         429), Anthropic ``billing_error``
``model.server_error``        yes        HTTP 5xx, Anthropic 529 ``overloaded_error``
``model.timeout``             yes        no answer within the timeout, HTTP 408
``model.connection``          yes        the server could not be reached
``model.auth``                no         HTTP 401, 403
``model.bad_request``         no         HTTP 400, 404, 422 and any other 4xx
``model.invalid_response``    yes        a 2xx answer the adapter cannot read
============================  =========  ==================================================

Messages say what happened and what to do. They quote the provider's own explanation, with
anything that looks like an API key redacted: OpenAI echoes a masked key back on a 401.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from durable_agents.engine.errors import ModelError

RATE_LIMITED = "model.rate_limited"
QUOTA_EXHAUSTED = "model.quota_exhausted"
SERVER_ERROR = "model.server_error"
TIMEOUT = "model.timeout"
CONNECTION = "model.connection"
AUTH = "model.auth"
BAD_REQUEST = "model.bad_request"
INVALID_RESPONSE = "model.invalid_response"
FAILED = "model.failed"

# Error types / codes in a provider's error body that mean "out of money", whatever status
# carried them: OpenAI sends insufficient_quota as a 429, which retrying never fixes.
_QUOTA_MARKERS = frozenset({"insufficient_quota", "billing_error", "billing_hard_limit_reached"})
# Anthropic has long reported an empty prepaid balance as a 400 invalid_request_error with
# this wording rather than as a 402 billing_error; retrying never helps either way.
_CREDIT_TOO_LOW = "credit balance is too low"

# sk-..., sk-proj-..., sk-ant-api03-..., including masked forms like "sk-proj-****abcd".
_KEY_PATTERN = re.compile(r"\b(?:sk|rk|pk)-[A-Za-z0-9_*\-]{6,}")
_MAX_DETAIL = 400


@dataclass(frozen=True)
class Provider:
    """How to name a provider in messages and where its key comes from."""

    name: str  # "OpenAI"
    adapter: str  # "OpenAIChat"
    key_env: str  # "OPENAI_API_KEY"
    console: str  # where to fix billing and limits


def classify(status: int | None, markers: Iterable[str | None] = ()) -> tuple[str, bool]:
    """Return ``(code, retryable)`` for an HTTP status and the error type/code strings."""
    found = {m for m in markers if m}
    if found & _QUOTA_MARKERS or status == 402:
        return QUOTA_EXHAUSTED, False
    if status is None:
        return FAILED, False
    if status == 429:
        return RATE_LIMITED, True
    if status == 408:
        return TIMEOUT, True
    if status >= 500:
        return SERVER_ERROR, True
    if status in (401, 403):
        return AUTH, False
    if 400 <= status < 500:
        return BAD_REQUEST, False
    return FAILED, False


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove the given secrets and anything shaped like an API key from ``text``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    text = _KEY_PATTERN.sub("[redacted]", text)
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 1] + "…"
    return text


def status_error(
    provider: Provider,
    *,
    status: int,
    markers: Iterable[str | None],
    provider_message: str | None,
    model: str,
    secrets: Iterable[str | None] = (),
    headers: Any = None,
) -> ModelError:
    """Build the ``ModelError`` for an HTTP error answer."""
    markers = tuple(markers)
    if provider_message and _CREDIT_TOO_LOW in provider_message.lower():
        markers += ("billing_error",)
    code, retryable = classify(status, markers)
    said = f": {redact(provider_message, secrets)}" if provider_message else ""
    what = f"{provider.name} answered HTTP {status}{said}".rstrip(".")
    p, adapter = provider.name, provider.adapter
    if code == RATE_LIMITED:
        fix = (
            f"The {p} rate limit was hit (retryable). If it persists, run fewer agents at once "
            f"or raise the limits in {provider.console}."
        )
    elif code == QUOTA_EXHAUSTED:
        fix = (
            f"The {p} account is out of quota or credit; retrying will not help. Add credit "
            f"or raise the spending limit in {provider.console}."
        )
    elif code == SERVER_ERROR:
        fix = f"{p} failed or is overloaded on its side (retryable)."
    elif code == TIMEOUT:
        fix = f"{p} timed out the request (retryable)."
    elif code == AUTH:
        fix = (
            f"The credentials were refused: check {provider.key_env} (or the api_key given to "
            f"{adapter}) and that the key may use model {model!r}."
        )
    elif code == BAD_REQUEST:
        fix = (
            f"The request was rejected and would be again: check the model name {model!r}, "
            f"the base_url, the tool schemas and the transcript."
        )
    else:
        fix = f"Unexpected answer from {p}."
    details: dict[str, Any] = {"provider": p.lower()}
    markers_found = [m for m in markers if m]
    if markers_found:
        details["error_type"] = markers_found[0]
    if headers is not None:
        retry_after = _retry_after(headers)
        if retry_after is not None:
            details["retry_after"] = retry_after
        request_id = headers.get("request-id") or headers.get("x-request-id")
        if request_id:
            details["request_id"] = request_id
    return ModelError(f"{what}. {fix}", code=code, retryable=retryable, status=status, **details)


def timeout_error(provider: Provider, *, timeout: float | None) -> ModelError:
    limit = f" within {timeout:g}s" if timeout else ""
    return ModelError(
        f"{provider.name} did not answer{limit} (retryable). For long generations raise "
        f"timeout= on {provider.adapter}.",
        code=TIMEOUT,
        retryable=True,
        provider=provider.name.lower(),
    )


def connection_error(
    provider: Provider, *, base_url: str, cause: BaseException | None
) -> ModelError:
    why = f" ({type(cause).__name__}: {redact(str(cause))})" if cause else ""
    return ModelError(
        f"Could not reach {provider.name} at {base_url}{why} (retryable). Check the network, "
        f"proxy settings and base_url.",
        code=CONNECTION,
        retryable=True,
        provider=provider.name.lower(),
    )


def invalid_response(provider: Provider, what: str) -> ModelError:
    return ModelError(
        f"{provider.name} answered without a usable result ({what}; retryable). An "
        f"OpenAI-compatible server may not support this request.",
        code=INVALID_RESPONSE,
        retryable=True,
        provider=provider.name.lower(),
    )


def _retry_after(headers: Any) -> float | None:
    # retry-after-ms is OpenAI's finer-grained variant; both SDKs honour it when they retry.
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except (TypeError, ValueError):
            continue  # an HTTP date: leave the pacing to the engine
    return None
