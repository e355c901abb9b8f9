"""Model adapters: the engine's ``Model`` protocol over real providers.

Importing this package imports no provider SDK: each adapter is loaded on first use, so
an app that only uses Anthropic does not need ``openai`` installed, and vice versa.

* ``OpenAIChat`` — OpenAI Chat Completions and compatible servers (``pip install
  'durable-agents[openai]'``).
* ``AnthropicMessages`` — the Anthropic Messages API (``pip install
  'durable-agents[anthropic]'``).
* ``ScriptedModel`` — a scripted model for tests and demos, no network (no API key). Its
  turns are built with ``text("answer")``, ``calls(call("tool", {...}), ...)`` and
  ``error(ModelError(...))``, also importable from ``durable_agents.providers.scripted``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .anthropic_messages import AnthropicMessages
    from .openai_chat import OpenAIChat
    from .scripted import ScriptedModel, call, calls, error, text

# Public name -> module that defines it, imported on first attribute access.
# New adapters: add a line here and to __all__.
_LAZY = {
    "OpenAIChat": ".openai_chat",
    "AnthropicMessages": ".anthropic_messages",
    "ScriptedModel": ".scripted",
    "text": ".scripted",
    "call": ".scripted",
    "calls": ".scripted",
    "error": ".scripted",
}

__all__ = ["AnthropicMessages", "OpenAIChat", "ScriptedModel", "call", "calls", "error", "text"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
