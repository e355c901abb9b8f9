"""``ask_staff``: a built-in tool the model itself calls to ask a member of staff a question.

It is the agentic counterpart of a gated tool: instead of a person deciding a call the model
made, the model asks a person for what it cannot find out itself (which warehouse, whether
an exception is allowed). An agent opts in by listing it: ``Agent(..., tools=[...,
da.ask_staff])``.

Under the hood it is ``ctx.interrupt``: the question is journaled (``wait:<name>``, kind
``interrupt``, with the question as its prompt), the run pauses ``awaiting_input``, and
``durable_agents.answer_interrupt(run_id, name, answer, by=...)`` (or the admin/API that
calls it) answers it; the answer is the tool's result, so the model reads it. The wait's
name is ``staff.<call id>`` — one question per call, listed by ``pending()``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from .tools import ToolContext, tool

MAX_CHOICES = 20
_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,94}")


def question_name(call_id: str) -> str:
    """The wait name of the question asked by call ``call_id``."""
    if _SAFE.fullmatch(call_id):
        return f"staff.{call_id}"
    # A provider's call id with characters a wait name does not allow: a stable digest.
    return f"staff.{hashlib.sha256(call_id.encode()).hexdigest()[:32]}"


def _ask_staff(question: str, ctx: ToolContext, choices: list[str] | None = None) -> Any:
    """Ask a member of staff a question and wait for their answer (it can take hours). Use
    it when you need a person's decision or knowledge your other tools cannot give you;
    give ``choices`` when the answer must be one of a few options."""
    # The model's mistakes go back to it as an error result it can correct.
    if not question.strip():
        raise ValueError("the question is empty: write the question for the staff member")
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if choices is not None:
        options = [c for c in choices if isinstance(c, str) and c.strip()]
        if not options or len(options) != len(choices) or len(set(options)) != len(options):
            raise ValueError("choices must be distinct non-empty strings (or left out)")
        if len(options) > MAX_CHOICES:
            raise ValueError(f"give at most {MAX_CHOICES} choices")
        schema = {"type": "string", "enum": options}
    return ctx.interrupt(question_name(ctx.call_id), question, schema=schema)


ask_staff = tool(_ask_staff, name="ask_staff", read_only=True)
