"""An MCP server in the world (issue 45): remote side effects whose answer can be lost.

In one cast in ten with the answerer (drawn from a stream of their own, ``remote:<seed>``;
the faults from ``remote-faults:<seed>``) the agent's tools include a ``da.mcp.Server``,
``crm``, whose annotations it trusts: ``crm__pay`` (a side effect: destructive, the
default), ``crm__peek`` (``readOnlyHint``) and ``crm__mail`` (``idempotentHint`` and not
destructive, with an ``idempotency_key`` argument the engine fills). It is the product's
own ``Server`` and ``McpTool`` — listing, schema validation, the safety classes, the
connection's probe and reconnect, and its mapping of failures to outcomes
(``mcp/connection.py``) — with one seam replaced: ``Server.client()`` hands out a client of
the simulated service instead of an ``mcp.Client`` over a real transport. The service acts
outside the journal and writes what it did to the world's ledger.

Before a call is sent, the service may restart (the held connection goes stale: the
probe reconnects), or be down for it (the probe fails twice: the call never ran, an error
result); the answer may be lost after the service acted (the connection drops: the call's
outcome is unknown) or the request before it left (the same error, judged as
conservatively). ``check`` holds the engine to what it promises about them.

In half the casts with the server (a stream of their own, ``remote-gate:<seed>``) the site
gates ``crm__pay`` (``ToolOptions(approval=True)``): people decide it in the inbox. The
server then has versions: a deploy of the site may bring the server's next one (its
``pay`` described anew: another definition, the same arguments), and the deployer aims
such a change at a payment waiting for its decision. ``remote_approvals_kept`` holds that a
gated call reaches the server only under the definition a person approved.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import durable_agents as da
from durable_agents.engine.journal import Journal
from durable_agents.engine.records import encode

from . import world as W
from .coverage import FAULTS

SERVER = "crm"
PAY, PEEK, MAIL = f"{SERVER}__pay", f"{SERVER}__peek", f"{SERVER}__mail"
# A side effect the server runs as a task (MCP 2025-11-25 "Tasks", ``mcp/tasks.py``).
SHIP = f"{SERVER}__ship"
ODDS = 0.1
# What may happen to one call (the service's own stream): the weights of each fate.
FATES = (
    ("answered", 56),
    ("restarted", 10),  # the server restarted since the last call: the probe reconnects
    ("down", 6),  # the server does not answer the probe, twice: the call never ran
    ("lost-before", 8),  # the connection drops before the request leaves
    ("lost-after", 20),  # the server acted, then the connection dropped: no answer
)
# How often the seed's plans pick each of the server's tools (besides the agent's own).
PICKS = (PAY, PAY, PAY, PAY, PEEK, MAIL, SHIP, SHIP, SHIP)
SENT = ("answered", "lost-after")  # the request reached the service
# What may happen at one poll of a task (``tasks/get``), from a stream of its own: the
# connection drops (the poll is tried again).
POLL_FATES = (("answered", 92), ("dropped", 8))
TASK_FAILS = 0.1  # a task that ends ``failed`` (nothing shipped)
# A task the service forgets at one of its polls (it expired, or the service restarted
# without keeping its tasks: "invalid params" for its id from then on), drawn when it is
# created: often, so that the seeds with the server meet it (a call that must halt).
FORGETS = 0.4
POLL_MS = 1000
# A target of the seed's own in the seeds with the coverage aim (``coverage.py``; drawn
# from ``remote-aim:<seed>``): a fault lands next to a task's handle (the task created,
# its id not kept yet), its progress note (the handle kept, polling), or a crash right
# after the task's result came back (before the result is journaled). Most tasks are run
# by the first drain's workers, where the coverage aim lands one fault too.
AIMS = (
    tuple((k, f) for k in ("handle", "@progress", "@progress") for f in FAULTS)
    + (("done", "crash before"),) * 3
)
AIM_ODDS = 0.9
# The casts whose ``crm__pay`` is gated (``remote-gate:<seed>``), and the server's changes
# the deployer aims at a payment awaiting its decision (``remote-version:<seed>``).
GATE_ODDS = 0.5
SERVER_CHANGES = 4


def takes_part(cfg: W.Config) -> bool:
    """Whether a seed's agent has the MCP server (a stream of its own: other seeds keep their
    schedules)."""
    return "answerer" in cfg.actors and random.Random(f"remote:{cfg.seed}").random() < ODDS


def gates_pay(seed: int) -> bool:
    """Whether a seed with the server gates ``crm__pay`` (a stream of its own)."""
    return random.Random(f"remote-gate:{seed}").random() < GATE_ODDS


@dataclass
class Request:
    """One call as the service saw it (or would have: ``lost-before`` never reached it)."""

    run: str
    call: str
    tool: str
    args: dict[str, Any]
    fate: str
    answer: Any = None  # the CallToolResult (dumped as the journal keeps it) it gave or lost
    task: str | None = None  # the task a task-augmented call created
    pid: int = 0  # the process that sent it
    # The tool's definition as the sending process listed it (``McpTool.definition_digest``).
    definition: str = ""


@dataclass
class Task:
    """A task the service runs (``crm__ship``): what it will end as is drawn when it is
    created; ``gets`` polls see it working first."""

    id: str
    run: str
    call: str
    args: dict[str, Any]
    working: int  # polls still to answer "working"
    ending: str  # "completed" | "failed"
    answer: Any  # what ``tasks/result`` gives (a completed task's result; a failed one's error)
    handled: bool  # the journal held a handle for the call when this task was created
    forget_at: int = 0  # the poll at which the service forgets it (0: never)
    forgotten: bool = False
    statuses: list[str] = field(default_factory=list)  # every status a poll answered
    results: int = 0  # ``tasks/result`` answers given
    polls: int = 0  # ``tasks/get`` requests that reached the service


@dataclass
class Service:
    """The remote service behind ``crm``: its state is outside every journal."""

    seed: int
    rng: random.Random = field(init=False)
    generation: int = 0  # bumped by a restart: a connection to an older one is gone
    failing_pings: int = 0  # probes still to fail (the server is down for a call)
    # Per process (a store read inside the call gives the baton to another one): the fate
    # of the call it is sending, its (run, call, tool), the journal seq it came after, and
    # whether the journal held the call's handle when it began.
    sending: dict[int, tuple[str, tuple[str, str, str] | None, int, bool]] = field(
        default_factory=dict
    )
    requests: list[Request] = field(default_factory=list)
    mailed: dict[str, Any] = field(default_factory=dict)  # idempotency key -> first answer
    receipts: int = 0
    server: Any = None
    tasks: dict[str, Task] = field(default_factory=dict)
    task_rng: random.Random = field(init=False)
    # The server's version (its ``pay`` described anew by each), whether the site gates
    # ``pay``, and the changes left to aim at a payment awaiting its decision.
    version: int = 0
    gated: bool = field(init=False)
    changes_left: int = SERVER_CHANGES
    version_rng: random.Random = field(init=False)
    # The payments a change was aimed at already (one change each).
    aimed: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.gated = gates_pay(self.seed)
        self.version_rng = random.Random(f"remote-version:{self.seed}")
        self.rng = random.Random(f"remote-faults:{self.seed}")
        self.task_rng = random.Random(f"remote-tasks:{self.seed}")
        aim = random.Random(f"remote-aim:{self.seed}")
        self.aim: tuple[str, str] | None = aim.choice(AIMS) if aim.random() < AIM_ODDS else None
        self.aim_rng = aim

    def aims_at(self, w: W.World, proc: Any) -> str:
        """The fault the seed's task target lands here ("" for none; ``AIMS``): once a
        seed, where the coverage aim's faults may land (``World.move``)."""
        if not self.aim:
            return ""
        where, fault = self.aim
        if where == "done":
            at = proc.point.startswith(f"tool {SHIP} ") and proc.point.endswith(" done")
        else:
            at = where in proc.writing
        if not at:
            return ""
        w.count(f"faults aimed at a task's {where}")
        self.aim = None
        return fault

    def _pid(self) -> int:
        proc = W.CURRENT.current if W.CURRENT is not None else None
        return proc.pid if proc is not None else 0

    def _sending(self) -> tuple[str, tuple[str, str, str] | None, int, bool]:
        return self.sending.get(self._pid(), ("answered", None, 0, False))

    @property
    def fate(self) -> str:
        return self._sending()[0]

    @property
    def context(self) -> tuple[str, str, str] | None:
        return self._sending()[1]

    def send(
        self, fate: str, context: tuple[str, str, str] | None, entered: int, held: bool
    ) -> None:
        """The current process is sending a call (``context`` None: it is done)."""
        if context is None:
            self.sending.pop(self._pid(), None)
        else:
            self.sending[self._pid()] = (fate, context, entered, held)

    def draw(self, w: W.World) -> str:
        """The fate of the call about to be sent (the same stream whatever else happens)."""
        # In every phase: most calls are made by the workers draining the queue, and a lost
        # answer leaves nothing to settle but a halt, which is a run at rest.
        fate = self.rng.choices([f for f, _ in FATES], [n for _, n in FATES])[0]
        if fate == "restarted":
            self.generation += 1
        elif fate == "down":
            self.failing_pings = 2
        w.count(f"remote calls {fate}")
        return "answered" if fate == "restarted" else fate

    # -- what the service does, on the connection's event loop (the caller waits) ----------

    def act(self, tool: str, args: dict[str, Any]) -> Any:
        from mcp.types import CallToolResult, TextContent

        assert self.context is not None, "the MCP service was called outside a tool call"
        run, call, _ = self.context
        if W.CURRENT is not None:
            W.CURRENT.begins(call)  # (as ``create`` says)
        order = args.get("order")
        if tool == "pay":
            self.receipts += 1
            body: dict[str, Any] = {"paid": args["amount"], "order": order, "r": self.receipts}
        elif tool == "mail":
            key = str(args.get("idempotency_key"))
            if key in self.mailed:  # the mailer dedupes by key: the first answer again
                body = self.mailed[key]
            else:
                self.receipts += 1
                body = self.mailed[key] = {"mailed": order, "r": self.receipts}
        else:
            body = {"order": order, "status": "open"}
        result = CallToolResult(
            content=[TextContent(type="text", text=json.dumps(body, sort_keys=True))],
            structured_content=body,
        )
        answer = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        # (A call sent once the server is back from being down reached it: answered.)
        fate = "lost-after" if self.fate == "lost-after" else "answered"
        self.requests.append(Request(run, call, tool, dict(args), fate, answer, pid=self._pid()))
        return result

    # -- tasks (``crm__ship``): created by a task-augmented ``tools/call``, polled ----------

    def create(self, w: W.World, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """A task-augmented ``tools/call``: the task is created (and the order shipped, the
        effect written to the ledger now: a driver killed before it hears of it leaves the
        effect behind), unless the request was lost before it left."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent

        assert self.context is not None, "the MCP service was called outside a tool call"
        run, call, local = self.context
        fate = self.fate
        if fate == "lost-before":
            self.requests.append(Request(run, call, name, dict(args), fate, pid=self._pid()))
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        # Held up past HALT_MIN_AGE since its claim (a store read inside the call comes
        # after the body's start): beyond the promise, as ``World.begins`` says.
        w.begins(call)
        rng = self.task_rng
        task_id = f"task-{len(self.tasks) + 1}"
        ending = "failed" if rng.random() < TASK_FAILS else "completed"
        if ending == "completed":
            self.receipts += 1
            body: dict[str, Any] = {"shipped": args.get("order"), "r": self.receipts}
            result = CallToolResult(
                content=[TextContent(type="text", text=json.dumps(body, sort_keys=True))],
                structured_content=body,
            )
        else:
            result = CallToolResult(
                content=[TextContent(type="text", text="out of stock")], is_error=True
            )
        answer = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        # (Read before the call began, in the process: not from the connection's loop.)
        handled = self._sending()[3]
        working = rng.randint(0, 3)
        forget_at = rng.randint(1, working + 1) if rng.random() < FORGETS else 0
        self.tasks[task_id] = Task(
            task_id, run, call, dict(args), working, ending, answer, handled, forget_at
        )
        fate = "lost-after" if fate == "lost-after" else "answered"
        self.requests.append(
            Request(run, call, name, dict(args), fate, answer, task_id, self._pid())
        )
        done = ending == "completed"
        w.record(
            local,
            run,
            call,
            dict(args),
            str(args.get("idempotency_key") or ""),
            answer if done else None,
            effect=done,
            outcome="returned" if done else "raised",
            entered=self._sending()[2],
        )
        w.count("remote tasks created")
        if fate == "lost-after":
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        return {"task": self._status(self.tasks[task_id], "working")}

    def kept_before_polls(self, w: W.World, run_id: str, call_id: str) -> None:
        """After a call of ``crm__ship`` in a process (however it ended): a task of the
        call that was polled has its id journaled (``handle:<call>``) — kept before any
        wait, so a crash while polling leaves a handle to poll again, not a halt."""
        polled = [
            t for t in self.tasks.values() if (t.run, t.call) == (run_id, call_id) and t.polls
        ]
        if run_id in w.forgotten:
            return  # deleted while the call was in flight: its journal went with it
        if polled and Journal(w.raw).get(run_id, f"handle:{call_id}") is None:
            w.violate(
                "remote_tasks_kept",
                f"run {run_id}: {SHIP} call {call_id} polled {polled[0].id} "
                f"{polled[0].polls} times, and its handle is not journaled",
            )

    def _status(self, task: Task, status: str) -> dict[str, Any]:
        return {
            "taskId": task.id,
            "status": status,
            "createdAt": "2026-01-01T00:00:00Z",
            "ttl": 3_600_000,
            "pollInterval": POLL_MS,
            "statusMessage": f"shipping order {task.args.get('order')}",
        }

    def _known(self, task_id: str) -> Task:
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS

        task = self.tasks.get(task_id)
        if task is None or task.forgotten:
            raise MCPError(INVALID_PARAMS, f"unknown task {task_id}")
        return task

    def get(self, w: W.World, task_id: str) -> dict[str, Any]:
        """``tasks/get``: the task's status (working, then its ending), unless the
        connection drops or the service forgets the task (from then on, for good)."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        task = self._known(task_id)
        task.polls += 1
        me = self._pid()
        if any(
            pid != me and sending[1] is not None and sending[1][:2] == (task.run, task.call)
            for pid, sending in self.sending.items()
        ):
            # A stale driver polls on while its successor resumes the call from its handle.
            w.count("remote tasks polled by two drivers at once")
        fate = self.task_rng.choices([f for f, _ in POLL_FATES], [n for _, n in POLL_FATES])[0]
        w.count(f"remote task polls {fate}")
        if fate == "dropped":
            self.generation += 1
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        if len(task.statuses) + 1 == task.forget_at:
            task.forgotten = True
            w.count("remote tasks forgotten")
            task = self._known(task_id)
        status = "working" if task.working > 0 else task.ending
        task.working = max(0, task.working - 1)
        task.statuses.append(status)
        return self._status(task, status)

    def result(self, task_id: str) -> dict[str, Any]:
        """``tasks/result``: a terminal task's result (its error, for a failed one)."""
        task = self._known(task_id)
        task.results += 1
        return dict(task.answer)


class _Session:
    """The narrowest seam ``mcp/tasks.py`` uses: the session's request stamp and its
    dispatcher's ``send_raw_request`` (the SDK leaves ``tasks/*`` out of its tables)."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self._dispatcher = self

    def _stamp(self, data: dict[str, Any], opts: dict[str, Any]) -> None:
        pass

    async def send_raw_request(self, method: str, params: Any, opts: Any) -> Any:
        from mcp import MCPError
        from mcp.types import METHOD_NOT_FOUND

        w = W.CURRENT
        assert w is not None
        self.client._alive()
        service = self.client.service
        params = dict(params or {})
        if method == "tools/call" and "task" in params and params.get("name") == "ship":
            return service.create(w, "ship", dict(params.get("arguments") or {}))
        if method == "tasks/get":
            return service.get(w, str(params.get("taskId")))
        if method == "tasks/result":
            return service.result(str(params.get("taskId")))
        raise MCPError(METHOD_NOT_FOUND, f"method {method} is not served here")


class _Client:
    """What ``mcp.Client`` offers the connection (``list_tools``, ``call_tool``), spoken to
    the simulated service; a restart of the service makes it fail as a dropped one does."""

    def __init__(self, service: Service) -> None:
        from types import SimpleNamespace

        self.service = service
        self.generation = service.generation
        self.session = _Session(self)
        # Runs tool calls as tasks (``tasks.requests.tools.call``): ``crm__ship`` is one.
        self.server_capabilities = SimpleNamespace(
            tasks=SimpleNamespace(requests=SimpleNamespace(tools=SimpleNamespace(call={})))
        )

    def _alive(self) -> None:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        if self.generation != self.service.generation:
            raise MCPError(CONNECTION_CLOSED, "Connection closed")

    async def list_tools(self, cursor: Any = None) -> Any:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, ListToolsResult

        self._alive()
        if self.service.failing_pings > 0:
            self.service.failing_pings -= 1
            self.service.generation += 1  # whatever answers next is a new process
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        return ListToolsResult(tools=listed(self.service.version))

    async def call_tool(
        self, name: str, arguments: dict[str, Any], progress_callback: Any = None
    ) -> Any:
        """(The service reports no progress of a plain call: a task's is its status.)"""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        self._alive()
        fate = self.service.fate
        if fate == "lost-before":
            run, call, _ = self.service.context or ("", "", "")
            self.service.requests.append(
                Request(run, call, name, dict(arguments), fate, pid=self.service._pid())
            )
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        result = self.service.act(name, arguments)
        if fate == "lost-after":
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        return result


def listed(version: int = 0) -> list[Any]:
    """The server's tools, as its ``version`` lists them (each describes ``pay`` anew)."""
    from mcp.types import Tool, ToolAnnotations, ToolExecution

    order = {"type": "integer"}
    return [
        Tool(
            name="pay",
            description="Take a payment for an order."
            + (f" (Revision {version}: now charged at once.)" if version else ""),
            inputSchema={
                "type": "object",
                "properties": {"order": order, "amount": {"type": "integer"}},
                "required": ["order", "amount"],
            },
            annotations=ToolAnnotations(destructive_hint=True),
        ),
        Tool(
            name="peek",
            description="Read an order's state.",
            inputSchema={
                "type": "object",
                "properties": {"order": order},
                "required": ["order"],
            },
            annotations=ToolAnnotations(read_only_hint=True),
        ),
        Tool(
            name="mail",
            description="Mail the customer (deduplicated by the caller's key).",
            inputSchema={
                "type": "object",
                "properties": {
                    "order": order,
                    "text": {"type": "string"},
                    "idempotency_key": {"type": "string"},
                },
                "required": ["order", "text", "idempotency_key"],
            },
            annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False),
        ),
        Tool(
            name="ship",
            description="Ship an order (the server runs it as a task: it takes a while).",
            inputSchema={
                "type": "object",
                "properties": {"order": order, "amount": {"type": "integer"}},
                "required": ["order", "amount"],
            },
            annotations=ToolAnnotations(destructive_hint=True),
            execution=ToolExecution(task_support="required"),
        ),
    ]


class SimServer(da.mcp.Server):
    """The product's ``Server`` whose client is the simulated service's (the one seam)."""

    def __init__(self, service: Service) -> None:
        gate = {"pay": da.mcp.ToolOptions(approval=True)} if service.gated else None
        super().__init__(SERVER, command=["sim-crm"], trust_annotations=True, tools=gate)
        self.service = service

    def client(self) -> Any:
        @contextlib.asynccontextmanager
        async def opened() -> AsyncIterator[Any]:
            yield _Client(self.service)

        return opened()

    def load_tools(self) -> list[Any]:
        tools = super().load_tools()
        for tool in tools:
            tool.invoke = _with_points(self.service, tool, tool.invoke)  # type: ignore[method-assign]
        return tools


def _with_points(service: Service, tool: Any, invoke: Any) -> Any:
    """The call as a process makes it: a scheduling point before it is sent and after its
    answer (or its failure) came back, so a crash lands between the service acting and the
    journal hearing of it; what the service did is written to the ledger in between."""

    def call(args: Any, ctx: Any) -> Any:
        w = W.CURRENT
        assert w is not None
        entered = w.entry_seq()
        name = tool.name
        w.step_begins(ctx.run_id, f"{name} call {ctx.call_id}", ctx.call_id)
        w.point(f"tool {name} {ctx.call_id} start")
        w.begins(ctx.call_id)
        w.work_begins(ctx.run_id, name, ctx.call_id)
        held = name == SHIP and Journal(w.raw).get(ctx.run_id, f"handle:{ctx.call_id}") is not None
        if held:
            w.count("remote tasks polled again by a later drive")
        service.send(service.draw(w), (ctx.run_id, ctx.call_id, name), entered, held)
        before = len(service.requests)
        acted = False
        try:
            return invoke(args, ctx)
        finally:
            service.send("", None, 0, False)
            # (Only this process's: another's call may have been sent meanwhile, a store
            # read inside this one giving it the baton.)
            for r in service.requests[before:]:
                if r.pid != service._pid():
                    continue
                r.definition = tool.definition_digest or ""
                acted = acted or r.fate in SENT
                if r.fate in SENT and r.task is None:  # (a task's effect: ``Service.create``)
                    w.record(
                        name,
                        r.run,
                        r.call,
                        {k: v for k, v in r.args.items() if k != "idempotency_key"},
                        str(r.args.get("idempotency_key") or ctx.idempotency_key),
                        r.answer,
                        effect=name != PEEK,
                        outcome="returned" if r.fate == "answered" else "unknown",
                        dedupe=name == MAIL,
                        entered=entered,
                    )
            if name == SHIP:
                service.kept_before_polls(w, ctx.run_id, ctx.call_id)
            # "done" once the service acted (where the kill fault aims), else "failed".
            w.point(f"tool {name} {ctx.call_id} {'done' if acted else 'failed'}")

    return call


def activate(w: W.World) -> SimServer:
    """The world's server (one per seed: its connection is the world's)."""
    if w.remote is None:
        w.remote = Service(w.config.seed)
    if w.remote.server is None:
        w.remote.server = SimServer(w.remote)
    return w.remote.server


def close(w: W.World) -> None:
    if w.remote is not None and w.remote.server is not None:
        w.remote.server.close()


# -- the invariant ------------------------------------------------------------------------


def check(w: W.World, ix: Any) -> None:
    """``remote_calls_kept``: a remote side effect is sent at most once per call of a run,
    whatever crashed, forked or resumed (the service counts what reached it); a side effect
    whose answer was lost ends in a halt — no result but a person's, never an error the
    model retries on nor a result nobody returned; and every result the engine recorded
    for a remote call is what the service answered for that call."""
    from .invariants import _copied

    service: Service | None = w.remote
    if service is None:
        return
    sent: dict[tuple[str, str], list[Request]] = {}
    for r in service.requests:
        sent.setdefault((r.run, r.call), []).append(r)
    for (run_id, call_id), found in sent.items():
        if run_id in w.forgotten or run_id not in ix.names:
            continue
        if found[0].tool == "ship":
            continue  # ``check_tasks``
        if found[0].tool == "pay" and len(found) > 1:
            w.violate(
                "remote_calls_kept",
                f"run {run_id}: the side effect {PAY} of call {call_id} was sent "
                f"{len(found)} times ({', '.join(r.fate for r in found)})",
            )
        rec = ix.names[run_id].get(f"tool:{call_id}")
        if rec is None or rec.get("patched") or rec.get("reconciled"):
            continue
        if _copied(w, ix, run_id, call_id, rec):
            continue
        lost = [r for r in found if r.fate not in ("answered",)]
        if found[0].tool == "pay" and lost:
            w.violate(
                "remote_calls_kept",
                f"run {run_id}: the answer of {PAY} call {call_id} was lost "
                f"({lost[0].fate}), yet the journal records {W._short(rec.get('result'))} "
                "that no person did: it must halt",
            )
            continue
        if rec.get("is_error"):
            continue
        answers = {encode(r.answer) for r in found if r.fate == "answered"}
        if encode(rec.get("result")) not in answers:
            w.violate(
                "remote_calls_kept",
                f"run {run_id}: call {call_id} ({found[0].tool}) records "
                f"{W._short(rec.get('result'))}, which the service did not answer",
            )
    if any(r.fate == "lost-after" and r.tool == "pay" for r in service.requests):
        w.count("remote side effects whose answer was lost")
    check_tasks(w, ix)
    check_approvals(w, ix)


def check_approvals(w: W.World, ix: Any) -> None:
    """``remote_approvals_kept``: a gated call of the server (``crm__pay`` in the casts that
    gate it) reaches the server only after a person approved it in the run that sends it —
    about the tool as the sending process listed it. An approval of the definition the call
    was first asked about does not send it under the server's next one: the call is asked
    again (``Driver._decision``; an approval recorded before decisions named a definition,
    or one a rule made, stands)."""
    service: Service | None = w.remote
    if service is None or not service.gated:
        return
    for r in service.requests:
        if r.tool != "pay" or r.fate not in SENT or r.run in w.forgotten:
            continue
        decisions = [
            rec
            for name, rec in ix.names.get(r.run, {}).items()
            if (name == f"approval:{r.call}" or name.startswith(f"approval:{r.call}:"))
            and rec.get("approved")
        ]
        if not decisions:
            w.violate(
                "remote_approvals_kept",
                f"run {r.run}: the gated call {r.call} of {PAY} reached the server unapproved",
            )
            continue
        if any(rec.get("tool_digest") in (None, r.definition) for rec in decisions):
            if any(rec.get("tool_digest") not in (None, r.definition) for rec in decisions):
                w.count("remote payments asked again after the server changed, then sent")
            continue
        w.violate(
            "remote_approvals_kept",
            f"run {r.run}: the gated call {r.call} of {PAY} was approved for the tool as "
            f"{sorted(str(rec.get('tool_digest')) for rec in decisions)} and sent under "
            f"{r.definition}, which nobody approved",
        )


# The reasons a task's call halts on (``mcp/tasks.py``), besides its time running out.
TASK_REASONS = (
    f"the connection to MCP server {SERVER!r} failed after the task call of ",
    f"MCP server {SERVER!r} no longer knows task ",
)


def check_tasks(w: W.World, ix: Any) -> None:
    """``remote_tasks_kept``: the server's tasks (``crm__ship``). ``tools/call`` creates a
    task at most once per call of a run, and never for a call whose handle the journal
    holds (a resume polls the task it names); the call's result is the one its task gave
    (``tasks/result``: a completed task's result, a failed one's error), or a person's —
    so a call whose task was forgotten before anyone read its result, or whose task call's
    answer was lost, ends halted, never an error the model retries on; and a progress note
    (``@progress/<call>/…``) is the service's word on that call's own task, as its handle
    names it."""
    from .invariants import _copied

    service: Service = w.remote
    by_call: dict[tuple[str, str], list[Task]] = {}
    for task in service.tasks.values():
        by_call.setdefault((task.run, task.call), []).append(task)
        if task.handled:
            w.violate(
                "remote_tasks_kept",
                f"run {task.run}: {SHIP} call {task.call} sent tools/call again ({task.id}) "
                "while the journal held its handle: a resume must poll the task it names",
            )
    lost: dict[tuple[str, str], str] = {}
    for r in service.requests:
        if r.tool == "ship" and r.fate != "answered":
            lost.setdefault((r.run, r.call), r.fate)
    for key in set(by_call) | set(lost):
        run_id, call_id = key
        if run_id in w.forgotten or run_id not in ix.names:
            continue
        tasks = by_call.get(key, [])
        if len(tasks) > 1:
            w.violate(
                "remote_tasks_kept",
                f"run {run_id}: {SHIP} call {call_id} created {len(tasks)} tasks "
                f"({', '.join(t.id for t in tasks)})",
            )
        rec = ix.names[run_id].get(f"tool:{call_id}")
        if rec is None or rec.get("patched") or rec.get("reconciled"):
            continue
        if _copied(w, ix, run_id, call_id, rec):
            continue
        given = [t for t in tasks if t.results]
        if key in lost and not given:
            w.violate(
                "remote_tasks_kept",
                f"run {run_id}: the task call of {SHIP} call {call_id} was lost "
                f"({lost[key]}), yet the journal records {W._short(rec.get('result'))} "
                "that no person did: it must halt",
            )
            continue
        if not tasks:
            continue  # never sent (the server down): an error the model reads
        if not given:
            forgot = any(t.forgotten for t in tasks)
            w.violate(
                "remote_tasks_kept",
                f"run {run_id}: {SHIP} call {call_id} records "
                f"{W._short(rec.get('result'))}, yet nobody read its task's result"
                + (" (the server forgot the task): it must halt" if forgot else ""),
            )
            continue
        if encode(rec.get("result")) not in {encode(t.answer) for t in given}:
            w.violate(
                "remote_tasks_kept",
                f"run {run_id}: {SHIP} call {call_id} records {W._short(rec.get('result'))}, "
                f"which is not what its task {given[0].id} gave",
            )
    tasks_by_id = service.tasks
    for run_id, recs in ix.records.items():
        if run_id in w.forgotten:
            continue
        for rec in recs:
            if not rec.name.startswith("@progress/"):
                continue
            call_id = rec.name.split("/")[1]
            handle = ix.names[run_id].get(f"handle:{call_id}")
            said = (handle.get("handle") or {}) if handle is not None else {}
            task = tasks_by_id.get(str(rec.get("task")))
            if (
                task is None
                or said.get("task_id") != task.id
                or rec.get("status") not in task.statuses
            ):
                w.violate(
                    "remote_tasks_kept",
                    f"run {run_id}: progress note {rec.name} ({W._short(rec.data)}) is not the "
                    f"service's word on the task the call's handle names ({said.get('task_id')})",
                )
    for run_id, row in ix.rows.items():
        # A fork copies a call's claim, not its handle (``steps.prefix``): its copy of a
        # call in flight halts, and never sends tools/call (``handled``, ``effects_once``).
        source = getattr(row, "forked_from", None)
        if not source or source not in ix.names or run_id in w.forgotten:
            continue
        if any(
            n.startswith("attempt:") and f"handle:{n.split(':')[1]}" in ix.names[source]
            for n in ix.names[run_id]
        ):
            w.count("forks of a call handed off to a task")
