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
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import durable_agents as da
from durable_agents.engine.records import encode

from . import world as W

SERVER = "crm"
PAY, PEEK, MAIL = f"{SERVER}__pay", f"{SERVER}__peek", f"{SERVER}__mail"
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
PICKS = (PAY, PAY, PAY, PAY, PEEK, MAIL)
SENT = ("answered", "lost-after")  # the request reached the service


def takes_part(cfg: W.Config) -> bool:
    """Whether a seed's agent has the MCP server (a stream of its own: other seeds keep their
    schedules)."""
    return "answerer" in cfg.actors and random.Random(f"remote:{cfg.seed}").random() < ODDS


@dataclass
class Request:
    """One call as the service saw it (or would have: ``lost-before`` never reached it)."""

    run: str
    call: str
    tool: str
    args: dict[str, Any]
    fate: str
    answer: Any = None  # the CallToolResult (dumped as the journal keeps it) it gave or lost


@dataclass
class Service:
    """The remote service behind ``crm``: its state is outside every journal."""

    seed: int
    rng: random.Random = field(init=False)
    generation: int = 0  # bumped by a restart: a connection to an older one is gone
    failing_pings: int = 0  # probes still to fail (the server is down for a call)
    fate: str = "answered"  # of the call being sent now
    context: tuple[str, str, str] | None = None  # (run, call, tool) of the call being sent
    requests: list[Request] = field(default_factory=list)
    mailed: dict[str, Any] = field(default_factory=dict)  # idempotency key -> first answer
    receipts: int = 0
    server: Any = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"remote-faults:{self.seed}")

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
        self.requests.append(Request(run, call, tool, dict(args), self.fate, answer))
        return result


class _Client:
    """What ``mcp.Client`` offers the connection (``list_tools``, ``call_tool``), spoken to
    the simulated service; a restart of the service makes it fail as a dropped one does."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.generation = service.generation

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
        return ListToolsResult(tools=listed())

    async def call_tool(
        self, name: str, arguments: dict[str, Any], progress_callback: Any = None
    ) -> Any:
        """(The service reports no progress of a plain call.)"""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        self._alive()
        fate = self.service.fate
        if fate == "lost-before":
            run, call, _ = self.service.context or ("", "", "")
            self.service.requests.append(Request(run, call, name, dict(arguments), fate))
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        result = self.service.act(name, arguments)
        if fate == "lost-after":
            raise MCPError(CONNECTION_CLOSED, "Connection closed")
        return result


def listed() -> list[Any]:
    from mcp.types import Tool, ToolAnnotations

    order = {"type": "integer"}
    return [
        Tool(
            name="pay",
            description="Take a payment for an order.",
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
    ]


class SimServer(da.mcp.Server):
    """The product's ``Server`` whose client is the simulated service's (the one seam)."""

    def __init__(self, service: Service) -> None:
        super().__init__(SERVER, command=["sim-crm"], trust_annotations=True)
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
        service.fate = service.draw(w)
        service.context = (ctx.run_id, ctx.call_id, name)
        before = len(service.requests)
        acted = False
        try:
            return invoke(args, ctx)
        finally:
            service.context = None
            for r in service.requests[before:]:
                acted = acted or r.fate in SENT
                if r.fate in SENT:
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
