"""Approval rules (docs/approvals.md): a company's approval policy, as an ordered list of rules
over a call's validated arguments — the first that matches decides, a default when none does.

    refund_policy = da.Rules(
        [
            da.Rule("small", da.arg("amount_cents") <= 5_000, da.allow),
            da.Rule("too-big", da.arg("amount_cents") > 500_000,
                    da.deny("Above 5,000 EUR refunds go by phone: ask the customer to call.")),
            da.Rule("lead", da.arg("amount_cents") <= 100_000, da.ask("support-leads")),
        ],
        default=da.ask(da.Quorum(2, "finance"), requester_may_decide=False),
        deadline=da.Deadline(remind="4h", escalate=("24h", "oncall"), expire="3d"),
    )

    @da.tool(approval=refund_policy)
    def refund(order_id: str, amount_cents: int) -> dict: ...

An outcome is ``allow`` (no person: an automatic decision naming the rule), ``deny(message)``
(the model is told the message) or ``ask(who)`` (one eligible member of a group, any
approver, or a ``Quorum``). Which rule matched is journaled with the call before anyone is
asked or anything fires, and read back ever after: resume, replay and fork never evaluate the
rules again for arguments they were evaluated for. ``requires_approval=True`` and
``approval=Quorum(...)`` are one-rule policies (``as_rules``).

A condition is a function ``(arguments, context) -> bool`` or, so that the approver's card can
say which values decided ("amount_cents 125000 > 100000"), a comparison built from
``arg(name)``: ``arg("amount_cents") > 100_000``, combined with ``&``, ``|`` and ``~``.
"""

from __future__ import annotations

import hashlib
import inspect
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .records import encode

RULE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
ALLOW, DENY, ASK = "allow", "deny", "ask"
ON_EXPIRY = ("deny", "cancel", "halt")


def _config(message: str) -> ConfigError:
    return ConfigError(message, code="config.approval_rules")


# -- durations ---------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def seconds(value: Any, what: str) -> float:
    """``"4h"``, ``"90m"``, ``"3d"``, ``"1w"`` or a number of seconds, > 0."""
    if isinstance(value, bool):
        raise _config(f"{what} must be a duration like '4h' or a number of seconds")
    if isinstance(value, int | float):
        out = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value.strip())):
        out = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise _config(
            f"{what} must be a duration like '30m', '4h', '3d' or a number of seconds, "
            f"not {value!r}"
        )
    if not out > 0:
        raise _config(f"{what} must be longer than 0, not {value!r}")
    return out


# -- deadlines ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    """When a pending request reminds its approvers, escalates to more of them, and
    expires, counted from when it was asked, on the database's clock. ``escalate`` is
    ``(after, group)``: from then on the members of ``group`` may decide too (escalation
    adds approvers, never lowers how many must approve). ``on_expiry``: ``"deny"`` (the
    model is told the request expired), ``"cancel"`` (the run is cancelled) or ``"halt"``
    (the run halts for a person)."""

    remind: Any = None
    escalate: tuple[Any, str] | None = None
    expire: Any = None
    on_expiry: str = "deny"

    def __post_init__(self) -> None:
        self.to_policy()  # validated here: a mistake is a ConfigError where it is written

    def to_policy(self) -> dict[str, Any]:
        """The deadline as a request's policy holds it (seconds after asking)."""
        out: dict[str, Any] = {}
        if self.remind is not None:
            out["remind"] = seconds(self.remind, "Deadline(remind=...)")
        if self.escalate is not None:
            if (
                not isinstance(self.escalate, tuple | list)
                or len(self.escalate) != 2
                or not isinstance(self.escalate[1], str)
                or not self.escalate[1]
            ):
                raise _config("Deadline(escalate=...) is (after, group), e.g. ('24h', 'oncall')")
            out["escalate"] = seconds(self.escalate[0], "Deadline(escalate=...)")
            out["escalate_to"] = self.escalate[1]
        if self.expire is not None:
            out["expire"] = seconds(self.expire, "Deadline(expire=...)")
        if self.on_expiry not in ON_EXPIRY:
            raise _config(f"Deadline(on_expiry=...) is one of {ON_EXPIRY}, not {self.on_expiry!r}")
        if not out:
            raise _config("a Deadline needs remind=, escalate= or expire=")
        steps = [out[k] for k in ("remind", "escalate", "expire") if k in out]
        if steps != sorted(steps) or len(set(steps)) != len(steps):
            raise _config("a Deadline's steps come in order: remind, then escalate, then expire")
        out["on_expiry"] = self.on_expiry
        return out


# -- outcomes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a rule decides: ``allow``, ``deny`` (with the message the model reads) or
    ``ask`` (``group``: who may decide, None for anyone holding ``approve_toolcall``;
    ``need`` of them; ``requester_may_decide=False``: the person who started the run may
    not decide its calls)."""

    kind: str
    message: str = ""
    group: str | None = None
    need: int = 1
    deadline: Deadline | None = None
    requester_may_decide: bool = True

    def policy(self, default_deadline: Deadline | None = None) -> dict[str, Any]:
        """The request policy an ``ask`` outcome asks under (``engine.approvals``)."""
        out: dict[str, Any] = (
            {"kind": "quorum", "need": self.need, "group": self.group}
            if self.need > 1
            else {"kind": "single", **({"group": self.group} if self.group else {})}
        )
        if not self.requester_may_decide:
            out["separate"] = True
        deadline = self.deadline or default_deadline
        if deadline is not None:
            out["deadline"] = deadline.to_policy()
        return out

    def describe(self) -> str:
        if self.kind == ALLOW:
            return "allowed"
        if self.kind == DENY:
            return "denied"
        who = f"members of {self.group}" if self.group else "an approver"
        return f"{self.need} of {who}" if self.need > 1 else f"1 of {who}"


allow = Outcome(ALLOW)


def deny(message: str) -> Outcome:
    """Refuse the call without asking anyone; the model reads ``message``."""
    if not isinstance(message, str) or not message.strip():
        raise _config("deny(message) needs the message the model reads")
    return Outcome(DENY, message=message)


def ask(
    who: Any = None, *, deadline: Deadline | None = None, requester_may_decide: bool = True
) -> Outcome:
    """Ask a person: ``ask()`` any approver, ``ask("leads")`` one eligible member of the
    group, ``ask(Quorum(2, "finance"))`` two of them."""
    from .approvals import Quorum

    if deadline is not None and not isinstance(deadline, Deadline):
        raise _config("ask(deadline=...) takes a da.Deadline")
    if not isinstance(requester_may_decide, bool):
        raise _config("ask(requester_may_decide=...) is True or False")
    if who is None:
        return Outcome(ASK, deadline=deadline, requester_may_decide=requester_may_decide)
    if isinstance(who, Quorum):
        return Outcome(
            ASK,
            group=who.group,
            need=who.need,
            deadline=deadline,
            requester_may_decide=requester_may_decide,
        )
    if isinstance(who, str) and who:
        return Outcome(ASK, group=who, deadline=deadline, requester_may_decide=requester_may_decide)
    raise _config(f"ask(...) takes a group's name or a da.Quorum, not {who!r}")


# -- conditions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleContext:
    """What a condition may read besides the arguments: the agent, the run, its session and
    who started it (a username, or the session's channel for a message nobody signed)."""

    agent: str
    run_id: str
    tool: str
    session_id: str | None = None
    requester: str | None = None


class Condition:
    """A condition the card can explain. Build with ``arg(name)`` and comparisons."""

    def __call__(self, arguments: Mapping[str, Any], context: RuleContext) -> bool:
        raise NotImplementedError

    def explain(self, arguments: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def __and__(self, other: Condition) -> Condition:
        return _Both(self, _condition(other), all, " and ")

    def __or__(self, other: Condition) -> Condition:
        return _Both(self, _condition(other), any, " or ")

    def __invert__(self) -> Condition:
        return _Not(self)


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "in": lambda a, b: a in b,
}


@dataclass(frozen=True, eq=False)
class _Compare(Condition):
    path: str
    op: str
    value: Any

    def _read(self, arguments: Mapping[str, Any]) -> Any:
        value: Any = arguments
        for part in self.path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return None
            value = value[part]
        return value

    def __call__(self, arguments: Mapping[str, Any], context: RuleContext) -> bool:
        found = self._read(arguments)
        if found is None:
            return False
        try:
            return bool(_OPS[self.op](found, self.value))
        except TypeError:
            return False

    def explain(self, arguments: Mapping[str, Any]) -> str:
        return f"{self.path} {encode(self._read(arguments))} {self.op} {encode(self.value)}"

    def __repr__(self) -> str:
        return f"arg({self.path!r}) {self.op} {self.value!r}"


@dataclass(frozen=True, eq=False)
class _Both(Condition):
    left: Condition
    right: Condition
    combine: Callable[[Any], bool]
    word: str

    def __call__(self, arguments: Mapping[str, Any], context: RuleContext) -> bool:
        return self.combine(c(arguments, context) for c in (self.left, self.right))

    def explain(self, arguments: Mapping[str, Any]) -> str:
        return f"({self.left.explain(arguments)}{self.word}{self.right.explain(arguments)})"

    def __repr__(self) -> str:
        return f"({self.left!r}{self.word}{self.right!r})"


@dataclass(frozen=True, eq=False)
class _Not(Condition):
    inner: Condition

    def __call__(self, arguments: Mapping[str, Any], context: RuleContext) -> bool:
        return not self.inner(arguments, context)

    def explain(self, arguments: Mapping[str, Any]) -> str:
        return f"not {self.inner.explain(arguments)}"

    def __repr__(self) -> str:
        return f"~{self.inner!r}"


@dataclass(frozen=True, eq=False)
class _Function(Condition):
    fn: Callable[..., Any]

    def __call__(self, arguments: Mapping[str, Any], context: RuleContext) -> bool:
        return bool(self.fn(arguments, context))

    def explain(self, arguments: Mapping[str, Any]) -> str:
        return getattr(self.fn, "__name__", "a condition")

    def __repr__(self) -> str:
        return _source_of(self.fn)


class arg:
    """An argument of the call, by name (``"address.country"`` reads a nested field), to
    compare: ``arg("amount_cents") > 100_000``, ``arg("country").is_in(["DE", "FR"])``."""

    def __init__(self, path: str) -> None:
        if not isinstance(path, str) or not path:
            raise _config("arg(name) needs an argument's name")
        self.path = path

    def __lt__(self, value: Any) -> Condition:
        return _Compare(self.path, "<", value)

    def __le__(self, value: Any) -> Condition:
        return _Compare(self.path, "<=", value)

    def __gt__(self, value: Any) -> Condition:
        return _Compare(self.path, ">", value)

    def __ge__(self, value: Any) -> Condition:
        return _Compare(self.path, ">=", value)

    def __eq__(self, value: Any) -> Condition:  # type: ignore[override]
        return _Compare(self.path, "==", value)

    def __ne__(self, value: Any) -> Condition:  # type: ignore[override]
        return _Compare(self.path, "!=", value)

    def is_in(self, values: Sequence[Any]) -> Condition:
        return _Compare(self.path, "in", tuple(values))

    __hash__ = None  # type: ignore[assignment]


def _condition(when: Any) -> Condition:
    if isinstance(when, Condition):
        return when
    if callable(when):
        return _Function(when)
    raise _config(f"a rule's condition is arg(...) comparisons or a function, not {when!r}")


def _source_of(fn: Callable[..., Any]) -> str:
    """What a function condition is, for the policy's fingerprint: its source when Python
    has it, else its qualified name."""
    try:
        return inspect.getsource(fn).strip()
    except (OSError, TypeError):
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# -- rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rule: a stable ``name`` (journaled with every call it decides), a condition and
    its outcome."""

    name: str
    when: Any
    then: Outcome

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not RULE_NAME.fullmatch(self.name):
            raise _config(f"a rule's name is 1-64 characters of A-Za-z0-9_.:-, not {self.name!r}")
        if not isinstance(self.then, Outcome):
            raise _config(
                f"rule {self.name!r}: its outcome is da.allow, da.deny(...) or da.ask(...)"
            )
        object.__setattr__(self, "when", _condition(self.when))


@dataclass(frozen=True)
class Match:
    """Which rule decided a call, its outcome, and why (the values that decided it)."""

    rule: str
    outcome: Outcome
    explain: str
    policy: dict[str, Any] | None  # the request policy of an ``ask``; None otherwise
    fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "outcome": self.outcome.kind,
            "message": self.outcome.message or None,
            "policy": self.policy,
            "explain": self.explain,
            "describe": self.outcome.describe(),
            "fingerprint": self.fingerprint,
        }


DEFAULT_RULE = "default"


@dataclass(frozen=True)
class Rules:
    """An ordered approval policy: the first rule whose condition holds decides; ``default``
    when none does. ``deadline`` applies to every ``ask`` outcome that has none of its own."""

    rules: Sequence[Rule]
    default: Outcome
    deadline: Deadline | None = None
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        rules = tuple(self.rules)
        if not all(isinstance(r, Rule) for r in rules):
            raise _config("Rules([...]) takes da.Rule(name, condition, outcome) items")
        if not isinstance(self.default, Outcome):
            raise _config("Rules(default=...) is required: da.allow, da.deny(...) or da.ask(...)")
        seen = [r.name for r in rules] + [DEFAULT_RULE]
        if len(set(seen)) != len(seen):
            raise _config(f"rule names are unique, and {DEFAULT_RULE!r} is the default's: {seen}")
        if self.deadline is not None and not isinstance(self.deadline, Deadline):
            raise _config("Rules(deadline=...) takes a da.Deadline")
        object.__setattr__(self, "rules", rules)
        described = [
            [r.name, repr(r.when), r.then.kind, r.then.message, self._policy(r.then)] for r in rules
        ] + [
            [DEFAULT_RULE, "", self.default.kind, self.default.message, self._policy(self.default)]
        ]
        digest = hashlib.sha256(encode(described).encode()).hexdigest()[:16]
        object.__setattr__(self, "fingerprint", digest)

    def _policy(self, outcome: Outcome) -> dict[str, Any] | None:
        return outcome.policy(self.deadline) if outcome.kind == ASK else None

    def evaluate(self, arguments: Mapping[str, Any], context: RuleContext) -> Match:
        """The rule that decides ``arguments``. A condition that raises decides nothing but
        a denial saying so: rules that cannot be read never let a call through."""
        for rule in self.rules:
            try:
                hit = rule.when(arguments, context)
            except Exception as exc:  # the site's code: any error refuses the call
                broken = Outcome(
                    DENY,
                    message=f"the approval rule {rule.name!r} could not be evaluated "
                    f"({type(exc).__name__}: {exc}); the call was not made",
                )
                return Match(rule.name, broken, "error", None, self.fingerprint)
            if hit:
                return Match(
                    rule.name,
                    rule.then,
                    rule.when.explain(arguments),
                    self._policy(rule.then),
                    self.fingerprint,
                )
        return Match(
            DEFAULT_RULE,
            self.default,
            "no rule matched",
            self._policy(self.default),
            self.fingerprint,
        )


def context_for(store: Any, run_id: str, tool: str) -> RuleContext:
    """What a condition may read about run ``run_id``: its agent, session, and who started
    it (its root's ``run:start`` names them when a person did)."""
    from . import names
    from .journal import Journal

    run = store.get_run(run_id)
    root = (run.root_run_id if run is not None else None) or run_id
    start = Journal(store).get(root, names.RUN_START) if store.get_run(root) else None
    requester = start.get("requester") if start is not None else None
    return RuleContext(
        agent=run.agent if run is not None else "",
        run_id=run_id,
        tool=tool,
        session_id=names.session_of(run_id),
        requester=str(requester) if requester else None,
    )


def demands_more(wanted: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    """Whether a request asked under ``given`` must move to ``wanted`` to need what
    ``wanted`` needs: more approvals, another group (or any group where anyone could
    decide), or duties separated where they were not. Never the other way: a pending
    request's needs only grow."""
    if int(wanted.get("need", 1)) > int(given.get("need", 1)):
        return True
    if wanted.get("group") and wanted.get("group") != given.get("group"):
        return True
    return bool(wanted.get("separate")) and not given.get("separate")


def at_least(wanted: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The policy a request asked under ``given`` moves to when ``wanted`` demands more
    (``demands_more``): ``wanted``'s group, and never fewer approvals or laxer duties than
    ``given`` held. A rule of another group can need fewer approvals than the request was
    asked under (one lead where two of finance were asked): the request keeps its count."""
    out = dict(wanted)
    need = max(int(wanted.get("need", 1)), int(given.get("need", 1)))
    if need > 1:
        out.update(kind="quorum", need=need)
    if given.get("separate"):
        out["separate"] = True
        if given.get("requester") and not out.get("requester"):
            out["requester"] = given["requester"]
    return out


def as_rules(approval: Any) -> Rules:
    """The tool's approval policy as ``Rules``: itself, or the one-rule policy that
    ``requires_approval=True`` (``ask()``) and ``approval=Quorum(...)`` (``ask(quorum)``) are."""
    if isinstance(approval, Rules):
        return approval
    if approval is None or approval is True:
        return Rules([], default=ask())
    return Rules([], default=ask(approval))
