"""``ReplayModel``: a model that answers from a recorded run's journal.

Turn ``n`` of a replay gets the assistant message, usage and finish the recording holds for
``model:<n>``; no provider is called. Before answering, the model checks the request against
what the recorded run was sent at that step (``request_divergence``) and raises
``ReplayDiverged`` at the first difference, so an agent driven by it fails at the step
where today's code stopped sending what the recording answered.

What a request is checked against, since the journal keeps digests rather than prompts:
the instructions' digest (``prompt_digest`` of the turn, or a fork's patched text), each
tool's schema hash (the fingerprint in force at the turn: ``run:start``, then any
``@drift/`` record), and the transcript, rebuilt from the journal up to the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import names, runtime
from .errors import ReplayDiverged
from .fingerprint import digest_of_hashes, instructions_digest, tool_hash, tools_digest
from .journal import Journal
from .model import FINISH_STOP, ModelRequest, ModelResponse, Usage
from .ports import Store
from .records import Record
from .steps import prefix
from .transcript import RunState

# The kinds of divergence, in the order a step is checked.
INSTRUCTIONS = "instructions"
TOOL_REMOVED = "tool_removed"
TOOL_CHANGED = "tool_changed"
REFUSED = "refused"
REQUEST = "request"
KINDS = (INSTRUCTIONS, TOOL_REMOVED, TOOL_CHANGED, REFUSED, REQUEST)


@dataclass(frozen=True)
class Divergence:
    """The first place today's code parts from a recording: the step, the kind, a sentence
    saying what differs, and both sides."""

    step: int
    kind: str
    message: str
    recorded: Any = None
    today: Any = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "kind": self.kind,
            "message": self.message,
            "recorded": self.recorded,
            "today": self.today,
        }

    def error(self) -> ReplayDiverged:
        return ReplayDiverged(
            f"replay diverged at step {self.step} ({self.kind}): {self.message}",
            step=self.step,
            kind=self.kind,
            recorded=self.recorded,
            today=self.today,
        )


def tools_at(records: Sequence[Record], turn: Record) -> dict[str, str] | None:
    """Each tool's schema hash as the fingerprint in force when ``turn`` was generated had
    it (the run's start, then the drift records written before the turn)."""
    tools: dict[str, str] | None = None
    for rec in records:
        if rec.seq > turn.seq and turn.seq:
            break
        if rec.name == names.RUN_START:
            tools = dict((rec.get("fingerprint") or {}).get("tools") or {})
        elif rec.name.startswith(names.DRIFT):
            tools = dict((rec.get("to") or {}).get("tools") or {})
    return tools


def called_at(state: RunState, tool: str) -> list[int]:
    """The steps whose turn calls ``tool``."""
    turns = enumerate(state.turns, start=1)
    return [n for n, turn in turns if any(c.name == tool for c in state.calls(turn))]


def recorded_instructions_digest(state: RunState, step: int, turn: Record) -> str:
    """The digest of what turn ``step`` was sent as instructions: a fork's patched text
    after its fork point, else what the turn recorded."""
    patched = _patched_instructions(state, step)
    if patched is not None:
        return instructions_digest(patched)
    return str(turn.get("prompt_digest") or "")


def _patched_instructions(state: RunState, step: int) -> str | None:
    fork = state.fork
    if fork is None or step <= int(fork.get("step") or 0):
        return None
    patched = (fork.get("patch") or {}).get("instructions")
    return None if patched is None else str(patched)


def instructions_for(state: RunState, step: int, default: str) -> str:
    """What the loop sends as instructions at ``step``: a fork's patch after its fork
    point, else the agent's."""
    patched = _patched_instructions(state, step)
    return default if patched is None else patched


def request_divergence(
    records: Sequence[Record], step: int, request: ModelRequest
) -> Divergence | None:
    """How ``request``, made at ``step``, differs from what the recorded run was sent
    there; None when it does not."""
    state = RunState.of(records)
    turn = state.turns[step - 1]
    recorded_digest = recorded_instructions_digest(state, step, turn)
    today_digest = instructions_digest(request.instructions)
    if recorded_digest != today_digest:
        return Divergence(
            step,
            INSTRUCTIONS,
            "the instructions differ from the ones the recorded turn was sent",
            recorded_digest,
            today_digest,
        )
    today_tools = {s.name: tool_hash(s) for s in request.tools}
    recorded_tools_digest = str(turn.get("tools_digest") or "")
    if recorded_tools_digest != tools_digest(request.tools):
        found = _tool_divergence(state, records, step, turn, today_tools)
        if found is not None:
            return found
    expected = RunState.of(prefix(records, step - 1)).messages()
    sent = list(request.messages)
    if expected != sent:
        i = next(
            (i for i, (x, y) in enumerate(zip(expected, sent, strict=False)) if x != y),
            min(len(expected), len(sent)),
        )
        return Divergence(
            step,
            REQUEST,
            f"the transcript sent differs from the recorded one at message {i + 1} "
            f"(of {len(expected)} recorded, {len(sent)} today)",
            [m.to_json() for m in expected[i:]],
            [m.to_json() for m in sent[i:]],
        )
    return None


def _tool_divergence(
    state: RunState,
    records: Sequence[Record],
    step: int,
    turn: Record,
    today: Mapping[str, str],
) -> Divergence:
    recorded = tools_at(records, turn)
    if recorded is None or digest_of_hashes(recorded) != turn.get("tools_digest"):
        # The fingerprint does not say which tools the turn was offered: only that they differ.
        return Divergence(
            step,
            REQUEST,
            "the tools offered differ from the ones the recorded turn was offered",
            turn.get("tools_digest"),
            digest_of_hashes(today),
        )
    removed = sorted(set(recorded) - set(today))
    if removed:
        return Divergence(
            step,
            TOOL_REMOVED,
            f"today's agent has no tool {', '.join(map(repr, removed))}, which the recorded "
            f"turn was offered (called at steps {called_at(state, removed[0]) or 'none'})",
            {name: recorded[name] for name in removed},
            None,
        )
    changed = sorted(t for t in recorded if recorded[t] != today[t])
    if changed:
        return Divergence(
            step,
            TOOL_CHANGED,
            f"the schema of tool {', '.join(map(repr, changed))} changed since the recorded "
            f"turn (called at steps {called_at(state, changed[0]) or 'none'})",
            {name: recorded[name] for name in changed},
            {name: today[name] for name in changed},
        )
    added = sorted(set(today) - set(recorded))
    return Divergence(
        step,
        REQUEST,
        f"today's request offers tools the recorded turn was not offered: {', '.join(added)}",
        sorted(recorded),
        sorted(today),
    )


class ReplayModel:
    """A model answering with a recorded run's turns, in order, without calling a provider.

    ``check=True`` (the default) compares each request with what the recording was sent at
    that step and raises ``ReplayDiverged`` on the first difference; a request beyond the
    recorded turns raises it too. ``calls`` counts the requests answered.
    """

    def __init__(
        self, records: Sequence[Record], *, check: bool = True, model_id: str | None = None
    ) -> None:
        self.records = list(records)
        self._turns = RunState.of(self.records).turns
        self.check = check
        self.calls = 0
        first = self._turns[0].get("model") if self._turns else None
        self.model_id = model_id or str(first or "replay")

    @classmethod
    def from_journal(
        cls, run_id: str, *, store: Store | None = None, check: bool = True
    ) -> ReplayModel:
        """A replay model for run ``run_id``'s journal."""
        return cls(Journal(store or runtime.store()).records(run_id), check=check)

    def generate(self, request: ModelRequest) -> ModelResponse:
        n = self.calls + 1
        if n > len(self._turns):
            raise Divergence(
                n,
                REQUEST,
                f"today's code asks for turn {n}; the recording has {len(self._turns)}",
            ).error()
        if self.check:
            found = request_divergence(self.records, n, request)
            if found is not None:
                raise found.error()
        self.calls = n
        turn = self._turns[n - 1]
        return ModelResponse(
            message=RunState.assistant(turn),
            usage=Usage.from_json(turn.get("usage")),
            finish=str(turn.get("finish") or FINISH_STOP),
            raw_finish=str(turn.get("raw_finish") or ""),
            model=str(turn.get("model") or ""),
        )
