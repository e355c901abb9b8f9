"""Who may do what: one table, read by the models, the admin, the API and the management
command.

Each action is allowed to a user holding any one of its permissions (superusers hold them
all). The permissions are Django's: the custom ones (``CUSTOM``) live on the Run model,
whose ``Meta.permissions`` is ``MODEL_PERMISSIONS``; the rest are the models' own
``view_*`` / ``add_*`` / ``delete_*``. The engine names the custom ones
(``engine.identity``), because its commands check them again whatever path the request
took; this table only reads those names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine.identity import (
    APPROVE_TOOLCALL,
    DELEGATE_APPROVALS,
    FORK_RUN,
    OPERATE_RUNS,
    RESOLVE_HALT,
)

VIEW_RUN = "durable_agents.view_run"
VIEW_APPROVALS = "durable_agents.view_approvalrequest"
VIEW_HALTS = "durable_agents.view_halt"
START_RUN = "durable_agents.add_run"
DELETE_RUN = "durable_agents.delete_run"
VIEW_NOTIFICATIONS = "durable_agents.view_notification"
# Retrying a notification is the outbox's alone (``notifications.outbox.retry``).
RETRY_NOTIFICATIONS = "durable_agents.change_notification"
# Importing is the glue's alone (``durable_agents.transfer``): no engine command checks it.
IMPORT_RUNS = "durable_agents.import_runs"

# The custom permissions, with the description the admin shows when granting them.
CUSTOM: tuple[tuple[str, str], ...] = (
    (APPROVE_TOOLCALL, "Can approve or deny tool calls"),
    (RESOLVE_HALT, "Can resolve halted tool calls"),
    (FORK_RUN, "Can fork runs"),
    (OPERATE_RUNS, "Can cancel and resume runs"),
    (IMPORT_RUNS, "Can import runs from an export"),
    (DELEGATE_APPROVALS, "Can record who decides for another approver"),
)


def codename(permission: str) -> str:
    """``"durable_agents.fork_run"`` → ``"fork_run"`` (what a model's Meta and the
    Permission table name)."""
    return permission.partition(".")[2]


# ``Run.Meta.permissions``. Migration 0001 holds the same list: a change here needs a
# migration (``makemigrations --check`` in the test command says so).
MODEL_PERMISSIONS: list[tuple[str, str]] = [(codename(p), what) for p, what in CUSTOM]


@dataclass(frozen=True)
class Rule:
    what: str  # "may not <what>"
    any_of: tuple[str, ...]


RULES: dict[str, Rule] = {
    # Operating or forking a run means reading it first: those permissions show runs too.
    "view_runs": Rule(
        "read runs, their journals, history, sessions and comparisons",
        (VIEW_RUN, OPERATE_RUNS, FORK_RUN),
    ),
    "view_approvals": Rule(
        "read the tool calls awaiting approval", (VIEW_APPROVALS, APPROVE_TOOLCALL)
    ),
    "view_halts": Rule("read halted tool calls", (VIEW_HALTS, RESOLVE_HALT)),
    "start": Rule("start a run or send a session a message", (START_RUN,)),
    "resume": Rule("resume a run", (OPERATE_RUNS,)),
    "cancel": Rule("cancel a run", (OPERATE_RUNS,)),
    "decide": Rule("decide a tool call", (APPROVE_TOOLCALL,)),
    # Who may decide a run's gated calls may answer its questions (engine.commands.waits).
    "answer": Rule("answer a run's question", (APPROVE_TOOLCALL,)),
    "signal": Rule("send a run a signal", (OPERATE_RUNS,)),
    # A message is a signal with a key: the same people may send one (engine.commands.waits).
    "enqueue": Rule("enqueue a message for a run", (OPERATE_RUNS,)),
    "wake": Rule("wake a sleeping run before its time", (OPERATE_RUNS,)),
    # The signature is the authority; relaying it needs to read what is being decided.
    "relay": Rule("relay a signed decision", (VIEW_APPROVALS, APPROVE_TOOLCALL)),
    "resolve": Rule("resolve a halt", (RESOLVE_HALT,)),
    "fork": Rule("fork a run", (FORK_RUN,)),
    "delete": Rule("delete a run", (DELETE_RUN,)),
    "import": Rule("import runs from an export", (IMPORT_RUNS,)),
    "delegate": Rule("record who decides for another approver", (DELEGATE_APPROVALS,)),
    # Approvers record, read and end their own (and those naming them as deputy); the
    # engine's delegation commands decide the rest.
    "delegations": Rule(
        "record or read delegations of approvals", (APPROVE_TOOLCALL, DELEGATE_APPROVALS)
    ),
    "view_notifications": Rule(
        "read the notifications sent and not sent", (VIEW_NOTIFICATIONS, RETRY_NOTIFICATIONS)
    ),
    "retry_notifications": Rule("retry notifications", (RETRY_NOTIFICATIONS,)),
}


def allows(user: Any, action: str) -> bool:
    """True if ``user`` (active) holds one of the permissions ``action`` needs."""
    if user is None or not getattr(user, "is_active", False):
        return False
    return any(user.has_perm(p) for p in RULES[action].any_of)


def needs(action: str) -> str:
    """The permissions ``action`` needs, for people: ``'a' or 'b'``."""
    return " or ".join(repr(p) for p in RULES[action].any_of)


def refusal(user: Any, action: str) -> str:
    """Why ``user`` may not do ``action``, naming the permission(s) to grant."""
    name = user.get_username() if user is not None else "this caller"
    return (
        f"{name!r} may not {RULES[action].what}: it needs the {needs(action)} permission "
        "(grant it in the admin, directly or through a group)"
    )
