"""ScriptedModel: a deterministic model for tests and demos.

It picks its turn by counting the assistant messages in the request, so after a resume it
answers exactly where the interrupted run left off, and a session's later turns continue
the script. Each turn is a text answer, one or more tool calls, or an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.errors import ModelError
from ..engine.model import (
    FINISH_STOP,
    FINISH_TOOL_CALLS,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)


@dataclass(frozen=True)
class Turn:
    """One scripted turn. Build turns with ``text``, ``call``/``calls`` and ``error``."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    error: ModelError | None = None
    usage: Usage = field(default_factory=lambda: Usage(10, 5))
    finish: str | None = None


def text(answer: str, usage: Usage | None = None) -> Turn:
    return Turn(text=answer, usage=usage or Usage(10, 5))


def call(
    name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None
) -> ToolCall:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or "", name=name, arguments=args)


def calls(*tool_calls: ToolCall, text: str = "", usage: Usage | None = None) -> Turn:
    return Turn(text=text, calls=tuple(tool_calls), usage=usage or Usage(10, 5))


def error(exc: ModelError) -> Turn:
    return Turn(error=exc)


class ScriptedModel:
    """Answers from a script. ``on_request`` (optional) sees every request, for tests."""

    # What a site's ``MODEL_RATES`` names this provider by (docs/limits.md).
    provider = "scripted"

    def __init__(
        self,
        turns: Sequence[Turn],
        *,
        model_id: str = "scripted",
        on_request: Callable[[ModelRequest], None] | None = None,
    ) -> None:
        self.turns = list(turns)
        self.model_id = model_id
        self.on_request = on_request
        self.requests = 0

    def generate(self, request: ModelRequest) -> ModelResponse:
        self.requests += 1
        if self.on_request is not None:
            self.on_request(request)
        n = sum(1 for m in request.messages if m.role == "assistant")
        if n >= len(self.turns):
            raise ModelError(
                f"the script has {len(self.turns)} turns and the request is for turn {n + 1}",
                code="model.script_exhausted",
            )
        turn = self.turns[n]
        if turn.error is not None:
            raise turn.error
        # Call ids default to the turn and position, so a replayed turn keeps its ids.
        tool_calls = tuple(
            ToolCall(c.id or f"call_{n + 1}_{i + 1}", c.name, c.arguments)
            for i, c in enumerate(turn.calls)
        )
        return ModelResponse(
            message=Message("assistant", turn.text, tool_calls=tool_calls),
            usage=turn.usage,
            finish=turn.finish or (FINISH_TOOL_CALLS if tool_calls else FINISH_STOP),
            raw_finish="scripted",
            model=self.model_id,
        )
