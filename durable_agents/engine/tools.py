"""Tools: typed functions the model can call, each with a safety class.

The safety class decides what a resume does with a call whose outcome is unknown:

* ``read_only=True`` — no side effect; re-run freely.
* ``idempotent=True`` — a side effect that is safe to repeat (pass ``ctx.idempotency_key``
  to the system you call); re-run.
* ``idempotency_key=fn(args)`` — a side effect keyed by your own data; re-run.
* none of these — a side effect: **at most once**. An attempt marker is journaled before the
  call; a resume that finds a marker and no result halts for a human.

``requires_approval=True`` (or an ``approval`` policy) adds a staff decision before the call.

Arguments live in two forms. The journal, the approval request, the decision and every
comparison between them hold the *JSON form*: the validated arguments as pydantic dumps them
in JSON mode (a model as an object, a datetime as ISO text, a Decimal as a string…). The
tool receives the Python values that exact JSON validates to, so what was approved or
journaled is exactly what runs.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, get_type_hints, runtime_checkable

import pydantic

from .errors import ConfigError, ProtocolError, ToolArgumentsError
from .limits import Rate, check_limit, parse_rate
from .model import ToolSpec
from .records import encode

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Infinity and NaN stay floats (which the journal refuses) instead of turning into null.
_JSON_CONFIG = pydantic.ConfigDict(ser_json_inf_nan="constants")
_ANY = pydantic.TypeAdapter(Any, config=_JSON_CONFIG)


@dataclass(frozen=True)
class Safety:
    read_only: bool = False
    idempotent: bool = False
    idempotency_key: Callable[[dict[str, Any]], str] | None = None
    requires_approval: bool = False
    approval: Any = None  # an approval policy (e.g. Quorum); implies requires_approval
    # Whether an approver may edit the arguments before approving (the edit runs instead).
    editable: bool = True
    # A saga's undo of this call's effect: ``compensate(args, result, ctx)``.
    compensate: Callable[[dict[str, Any], Any, ToolContext], Any] | None = None
    # When a pending request of a plain gated call reminds, escalates and expires
    # (``rules.Deadline``); a tool with ``Rules`` has it as its rules' default instead.
    deadline: Any = None

    @property
    def retry_safe(self) -> bool:
        return self.read_only or self.idempotent or self.idempotency_key is not None

    @property
    def gated(self) -> bool:
        return self.requires_approval or self.approval is not None


@dataclass
class ToolContext:
    """What a tool may know about the call it serves.

    ``idempotency_key`` is the same every time this call runs (after a crash too): pass it
    to the system you write to. ``once_key()`` numbers each idempotent operation the call
    makes, in call order, so each keeps its key when the call runs again.
    """

    run_id: str
    call_id: str
    tool_name: str
    idempotency_key: str
    _counter: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # The call's waits (``engine.waits.CallWaits``), set by the driver.
    _waits: Any = field(default=None, repr=False)
    # The records the call may write about itself (``engine.handles.CallRecords``), set by
    # the driver; None outside a run.
    _records: Any = field(default=None, repr=False)

    def once_key(self) -> str:
        with self._lock:
            self._counter += 1
            return f"{self.idempotency_key}:{self._counter}"

    def interrupt(self, name: str, prompt: str, schema: Any = None) -> Any:
        """Ask a person ``prompt`` and return their answer, checked against ``schema`` (a
        pydantic model class, returned as an instance, or a JSON schema dict). Until it is
        answered the run pauses ``awaiting_input`` and this tool runs again from the top
        once it is: only a retry-safe tool may wait (see docs/waiting.md)."""
        return self._run_waits().interrupt(name, prompt, schema)

    def await_signal(self, name: str, timeout: float | None = None) -> Any:
        """The payload of the signal ``name`` (``durable_agents.signal``), delivered before
        or after this wait; with ``timeout`` (seconds), a ``TimedOut`` if the timeout won.
        The outcome is decided once. Only a retry-safe tool may wait."""
        return self._run_waits().await_signal(name, timeout)

    def receive(self, channel: str) -> Any:
        """The oldest message on the run's ``channel`` that nothing acked yet (a
        ``ChannelMessage`` with ``key`` and ``payload``), in enqueue order. It stays the
        oldest until ``ack`` consumes it. With none, the run pauses ``awaiting_input`` until
        ``durable_agents.enqueue`` delivers one and this tool runs again from the top: only
        a retry-safe tool may receive (see docs/waiting.md)."""
        return self._run_waits().receive(channel)

    def ack(self, channel: str, key: str) -> bool:
        """Consume the message ``key`` of ``channel``, once: True for the call that did
        (again when it re-runs), False if another call consumed it first."""
        return self._run_waits().ack(channel, key)  # type: ignore[no-any-return]

    def sleep(self, name: str, seconds: float) -> datetime:
        """Sleep ``seconds`` (the wake time is journaled on first encounter: a recovered or
        redeployed run wakes at that same instant). Until then the run pauses ``sleeping``
        and this tool runs again from the top. Only a retry-safe tool may sleep. Returns
        the wake time."""
        return self._run_waits().sleep(name, seconds)  # type: ignore[no-any-return]

    def wait_until(self, name: str, when: datetime) -> datetime:
        """Like ``sleep``, until ``when`` (a timezone-aware datetime)."""
        return self._run_waits().wait_until(name, when)  # type: ignore[no-any-return]

    def handle(self) -> dict[str, Any] | None:
        """The handle this call journaled with ``keep_handle`` (in this drive or one before
        a crash), or None: the tool resumes waiting on it instead of starting its work again
        (``engine.handles``; the tool must set ``resumes = True``). None outside a run."""
        if self._records is None:
            return None
        return self._records.handle()  # type: ignore[no-any-return]

    def keep_handle(self, value: dict[str, Any]) -> dict[str, Any]:
        """Journal where this call's work is held (a remote task's id) before waiting on it;
        returns the handle the journal holds. Outside a run it is not kept anywhere."""
        if self._records is None:
            return value
        return self._records.keep_handle(value)  # type: ignore[no-any-return]

    def note_progress(self, note: dict[str, Any]) -> bool:
        """Journal how far this call has got, for people following the run live (never
        replayed; best effort). Call it sparingly: each note is a journal write."""
        if self._records is None:
            return False
        return self._records.note_progress(note)  # type: ignore[no-any-return]

    def _run_waits(self) -> Any:
        if self._waits is None:
            raise ConfigError(
                f"tool {self.tool_name!r} was called outside a run: it can wait only when a "
                "run's driver calls it",
                code="config.wait_outside_run",
            )
        return self._waits


@runtime_checkable
class ToolSource(Protocol):
    """Tools known only at run time, e.g. an MCP server's (``durable_agents.mcp.Server``):
    an agent lists them when it first needs its tools in a process."""

    def load_tools(self) -> Sequence[Tool]: ...


def is_tool_source(value: Any) -> bool:
    return isinstance(value, ToolSource)


def call_key(run_id: str, call_id: str) -> str:
    """A stable key for one tool call of one run."""
    return hashlib.sha256(f"{run_id}\x00{call_id}".encode()).hexdigest()[:32]


class Tool:
    """A function the model can call. Build one with ``@durable_agents.tool``."""

    # The agent a sub-agent tool (``agent.as_tool()``) runs, else None.
    subagent: str | None = None
    # A sub-agent tool's agent (its definition), which a saga rolling back the tree needs to
    # drive the child's rollback, and how: ``rollback(store, parent, child, cause)``
    # (``saga_tree.rollback_child``). None on every other tool.
    subagent_def: Any = None
    # Limits across every worker (``engine.limits``): calls per period, calls at once.
    rate: Rate | None = None
    max_concurrent: int | None = None
    # Where a tool comes from when it is not a Python function of this site: e.g. an MCP
    # server's (server, remote name, declared annotations, the class chosen), for people.
    origin: Mapping[str, Any] | None = None
    # For a tool the site did not write, a digest of its definition as its source declared
    # it (an MCP server's name, description, input schema and annotations). A decision on a
    # gated call is bound to it: a call whose tool changed between asking and deciding (or
    # running) is asked again. None for a Python tool, whose changes are the site's deploys.
    definition_digest: str | None = None
    # Whether a call with a journaled handle (``ToolContext.keep_handle``) and no result is
    # resumed by calling ``invoke`` again, which waits on the handle (``engine.handles``),
    # instead of halting a side effect on its live attempt.
    resumes: bool = False
    subagent_rollback: Callable[..., tuple[Any, bool]] | None = None

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        safety: Safety = Safety(),
        summary: Callable[[dict[str, Any]], str] | None = None,
        sensitive: Sequence[str] = (),
        identifying: Sequence[str] = (),
    ) -> None:
        self.fn = fn
        # For people only (the approval page): the model never sees it, so it may be wrong
        # without harm, and a failing one falls back to the schema's fields.
        self.summary = summary
        self.name = name or fn.__name__
        if not _TOOL_NAME.fullmatch(self.name):
            raise ConfigError(
                f"tool name {self.name!r} must be 1-64 characters of A-Za-z0-9_- "
                "(what every provider accepts)",
                code="config.tool_name",
            )
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.safety = safety
        self.context_param, fields = _fields_of(fn)
        config = pydantic.ConfigDict(extra="forbid", strict=True, **_JSON_CONFIG)
        try:
            self._model: type[pydantic.BaseModel] = pydantic.create_model(
                f"{self.name}_arguments", __config__=config, **fields
            )
            schema = self._model.model_json_schema()
        except pydantic.PydanticUserError as exc:
            raise ConfigError(
                f"tool {self.name}: its parameters cannot be described to a model as JSON "
                f"({exc}); use JSON-friendly types or pydantic models",
                code="config.tool_signature",
            ) from None
        hidden = [key for key, info in self._model.model_fields.items() if info.exclude]
        if hidden:
            raise ConfigError(
                f"tool {self.name}: parameter(s) {', '.join(hidden)} are excluded from "
                "serialization, so the journaled arguments could not say what the tool ran "
                "with; drop exclude=True",
                code="config.tool_signature",
            )
        schema.pop("title", None)
        self.parameters: dict[str, Any] = schema
        # Argument fields whose values exports and audit bundles hide (docs/audit.md).
        self.sensitive = self._argument_names("sensitive", sensitive, "config.tool_sensitive")
        # Argument fields that say what a call is about (a payee, an amount): people who
        # decide or resolve a call read them first, and the decision names them
        # (docs/admin.md). For people only, like ``summary``.
        self.identifying = self._argument_names(
            "identifying", identifying, "config.tool_identifying"
        )

    def _argument_names(self, option: str, names: Sequence[str], code: str) -> tuple[str, ...]:
        """``names``, checked to be a list of this tool's argument names, without repeats."""
        if isinstance(names, str) or not all(isinstance(f, str) for f in names):
            raise ConfigError(
                f"tool {self.name}: {option} must be a list of argument names, e.g. "
                f"{option}=[{', '.join(map(repr, list(self._model.model_fields)[:2]))}]",
                code=code,
            )
        unknown = [f for f in names if f not in self._model.model_fields]
        if unknown:
            raise ConfigError(
                f"tool {self.name}: {option} names {', '.join(map(repr, unknown))}, which "
                f"is not an argument of the tool (its arguments: "
                f"{', '.join(self._model.model_fields) or 'none'})",
                code=code,
            )
        return tuple(dict.fromkeys(names))

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse and validate the model's JSON arguments strictly and return their JSON
        form (what is journaled, approved and compared), or raise ``ToolArgumentsError``
        with a message the model can act on. The JSON form validates to itself, so the
        values the tool receives (``values``) are exactly the ones it stands for."""
        data, text = self._json_form(self._parse(arguments.strip() or "{}"))
        try:
            _, again = self._json_form(self._parse(text))
        except ToolArgumentsError:
            again = None
        if again != text:
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: they do not read back the same once "
                f"written as JSON ({text}); the tool cannot run with them as journaled"
            )
        return data

    def values(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The Python values (pydantic models, datetimes…) the tool is called with, from
        the JSON form of its arguments."""
        model = self._parse(encode(dict(args)))
        return {key: getattr(model, key) for key in type(model).model_fields}

    def invoke(self, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Call the tool with the values the JSON form ``args`` validates to."""
        kwargs = self.values(args)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        return self.fn(**kwargs)

    def key_for(self, run_id: str, call_id: str, args: Mapping[str, Any]) -> str:
        """The call's idempotency key; an ``idempotency_key`` function gets the Python
        values, as the tool does."""
        if self.safety.idempotency_key is not None:
            return str(self.safety.idempotency_key(self.values(args)))
        return call_key(run_id, call_id)

    def _parse(self, text: str) -> pydantic.BaseModel:
        try:
            return self._model.model_validate_json(text)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from None

    def _json_form(self, model: pydantic.BaseModel) -> tuple[dict[str, Any], str]:
        """The model's JSON form and its canonical text."""
        try:
            data = model.model_dump(mode="json")
            text = encode(data)
        except (ValueError, ProtocolError) as exc:  # a PydanticSerializationError too
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: they cannot be journaled as JSON: {exc}"
            ) from None
        return data, text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"


def json_result(value: Any) -> Any:
    """A tool's return value as the journal keeps it: plain JSON as it is; pydantic models,
    dataclasses, datetimes, enums, UUIDs, Decimals… in pydantic's JSON form. Raises the
    ``ProtocolError`` of plain JSON when neither holds it (an arbitrary object, NaN)."""
    try:
        encode(value)
        return value
    except ProtocolError as exc:
        refused = exc
    try:
        converted = _ANY.dump_python(value, mode="json")
        encode(converted)
    except (ProtocolError, ValueError, TypeError, RecursionError):  # pydantic's errors too
        raise refused from None
    return converted


def _unresolved(fn: Callable[..., Any], exc: BaseException) -> str:
    """Which of ``fn``'s type hints the failure ``exc`` is about, as best it can be told."""
    hints = getattr(fn, "__annotations__", {})
    missing = getattr(exc, "name", None)
    for param, hint in hints.items():
        text = hint if isinstance(hint, str) else repr(hint)
        if missing and re.search(rf"\b{re.escape(missing)}\b", text):
            what = "the return type hint" if param == "return" else f"the type hint of {param!r}"
            return f"{what} ({text!r})"
    return "a type hint"


def _fields_of(fn: Callable[..., Any]) -> tuple[str | None, dict[str, Any]]:
    # include_extras: Annotated[..., Field(gt=0, description=...)] is part of the schema.
    try:
        hints = get_type_hints(fn, include_extras=True)
    except (NameError, AttributeError, SyntaxError, TypeError) as exc:
        # A hint written as text (``from __future__ import annotations``, quotes) is resolved
        # here, in the tool's module: a name imported only under TYPE_CHECKING, a typo or a
        # class defined after the tool fails now, naming the tool, not at its first call.
        raise ConfigError(
            f"tool {fn.__name__}: {_unresolved(fn, exc)} cannot be resolved ({exc}); a tool's "
            "parameter types are read when it is defined: import them at module level (not "
            "only under TYPE_CHECKING) and define them before the tool",
            code="config.tool_signature",
        ) from None
    context_param = None
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext:
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(
                f"tool {fn.__name__}: *args/**kwargs cannot be described to a model; "
                "list the parameters",
                code="config.tool_signature",
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    return context_param, fields


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    idempotency_key: Callable[[dict[str, Any]], str] | None = None,
    requires_approval: bool = False,
    approval: Any = None,
    editable: bool = True,
    summary: Callable[[dict[str, Any]], str] | None = None,
    sensitive: Sequence[str] = (),
    identifying: Sequence[str] = (),
    compensate: Callable[[dict[str, Any], Any, ToolContext], Any] | None = None,
    rate: str | None = None,
    max_concurrent: int | None = None,
    deadline: Any = None,
) -> Any:
    """Turn a typed function into a ``Tool``. Its JSON schema comes from the type hints,
    its description from the docstring. Use bare (``@tool``) or with options.

    ``editable=False`` forbids an approver to edit a gated call's arguments before approving
    (approve or deny only). ``summary=fn`` (``fn(arguments) -> str``) gives the approval page
    a one-line reading of a call, e.g. "Refund 42.00 to order 7"; it reads the arguments'
    JSON form (as journaled), while ``idempotency_key=fn`` gets the Python values the tool
    gets (a pydantic model as an instance, a datetime as a datetime). ``sensitive=[...]``
    names argument fields whose values exports and audit bundles show as salted hashes
    (docs/audit.md); a name that is not an argument is a ``ConfigError``.
    ``identifying=["payee", "amount_cents"]`` names the arguments that say what a call is
    about: the admin shows them first, before the others (a long memo cannot push them off
    the screen), and its decision bar names them beside Approve (docs/admin.md); a name that
    is not an argument is a ``ConfigError``. For people only: the model never sees it.

    ``compensate=undo`` declares how a saga (``Agent(saga=True)``) reverses this call's
    effect once the run aborts: ``undo(args, result, ctx)`` gets the call's arguments (the
    Python values the tool got), its journaled result and a ``ToolContext`` whose
    ``idempotency_key`` is the undo's own. An undo runs at most once (see
    docs/composition.md).

    ``rate="10/s"`` (or ``"500/m"``, ``"3/10s"``) and ``max_concurrent=N`` limit how often and
    how many calls of this tool run at once, across every worker (docs/limits.md): a run
    that would exceed either waits, ``throttled``, and tries again.

    ``deadline=da.Deadline(remind="4h", escalate=("24h", "oncall"), expire="3d")`` says when
    a pending request of this gated tool reminds its approvers, escalates and expires
    (docs/approvals.md, "Deadlines"): for ``requires_approval=True`` and ``Quorum`` its
    requests', for ``da.Rules`` every ``ask`` outcome's that has no deadline of its own (as
    ``Rules(deadline=...)``, which it may not repeat)."""
    what = f"tool {name or getattr(fn, '__name__', '?')!r}"
    safety, parsed_rate, concurrent = checked_options(
        what,
        read_only=read_only,
        idempotent=idempotent,
        idempotency_key=idempotency_key,
        requires_approval=requires_approval,
        approval=approval,
        editable=editable,
        summary=summary,
        compensate=compensate,
        rate=rate,
        max_concurrent=max_concurrent,
        deadline=deadline,
    )

    def wrap(f: Callable[..., Any]) -> Tool:
        made = Tool(
            f,
            name=name,
            description=description,
            safety=safety,
            summary=summary,
            sensitive=sensitive,
            identifying=identifying,
        )
        made.rate, made.max_concurrent = parsed_rate, concurrent
        return made

    return wrap(fn) if fn is not None else wrap


def checked_options(
    what: str,
    *,
    read_only: bool = False,
    idempotent: bool = False,
    idempotency_key: Callable[[dict[str, Any]], str] | None = None,
    requires_approval: bool = False,
    approval: Any = None,
    editable: bool = True,
    summary: Callable[[dict[str, Any]], str] | None = None,
    compensate: Callable[[dict[str, Any], Any, ToolContext], Any] | None = None,
    rate: str | None = None,
    max_concurrent: int | None = None,
    deadline: Any = None,
) -> tuple[Safety, Rate | None, int | None]:
    """A tool's options, checked (``ConfigError`` naming ``what``): its safety class and
    approval policy, its rate and its concurrency limit. ``@tool`` and tools from other
    sources (``durable_agents.mcp``) go through this one check."""
    parsed_rate = parse_rate(rate, what) if rate is not None else None
    concurrent = check_limit(max_concurrent, f"{what}: max_concurrent")
    if compensate is not None and not callable(compensate):
        raise ConfigError(
            "compensate must be a function undo(args, result, ctx)", code="config.tool_safety"
        )
    if compensate is not None and read_only:
        raise ConfigError(
            "a read_only tool has no effect to undo: drop compensate= or read_only=True",
            code="config.tool_safety",
        )
    if read_only and (idempotent or idempotency_key is not None):
        raise ConfigError(
            "a tool is read_only or idempotent, not both: read_only already means safe to re-run",
            code="config.tool_safety",
        )
    if not isinstance(editable, bool):
        raise ConfigError("editable must be True or False", code="config.tool_safety")
    if approval is not None:
        from .approvals import Quorum
        from .rules import Rules

        if not isinstance(approval, Quorum | Rules):
            raise ConfigError(
                f"{what}: approval= takes da.Quorum(need, group) or da.Rules([...], default=...), "
                f"not {approval!r}",
                code="config.tool_safety",
            )
    if deadline is not None:
        approval = _with_deadline(what, deadline, requires_approval, approval)
    if summary is not None and not callable(summary):
        raise ConfigError("summary must be a function of the arguments", code="config.tool_summary")
    safety = Safety(
        read_only,
        idempotent,
        idempotency_key,
        requires_approval,
        approval,
        editable,
        compensate,
        deadline,
    )
    return safety, parsed_rate, concurrent


def _with_deadline(what: str, deadline: Any, requires_approval: bool, approval: Any) -> Any:
    """The tool's approval policy once its ``deadline=`` is checked: ``Rules`` gain it as
    their default deadline (their fingerprint with it); a one-rule gate keeps it on
    ``Safety.deadline``."""
    from .rules import Deadline, Rules

    if not isinstance(deadline, Deadline):
        raise ConfigError(
            f"{what}: deadline= takes a da.Deadline(remind=..., escalate=..., expire=...), "
            f"not {deadline!r}",
            code="config.tool_safety",
        )
    if not requires_approval and approval is None:
        raise ConfigError(
            f"{what}: deadline= is for a gated tool: add requires_approval=True or approval=",
            code="config.tool_safety",
        )
    if isinstance(approval, Rules):
        if approval.deadline is not None:
            raise ConfigError(
                f"{what}: its Rules have a deadline already; give it once, on the tool or on "
                "the Rules",
                code="config.tool_safety",
            )
        return replace(approval, deadline=deadline)
    return approval
