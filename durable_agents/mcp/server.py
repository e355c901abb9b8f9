"""``Server``: an MCP server whose tools an agent calls as durable tools.

A server is a tool source (``engine.tools.ToolSource``): listed in an agent's ``tools=``,
its tools are listed the first time the agent needs them in a process, and each becomes an
``McpTool`` — a ``Tool`` with the server's JSON schema, validated before any call, and a
safety class: a side effect unless its options or trusted annotations say otherwise.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.errors import ConfigError, ToolArgumentsError, ToolResultError
from ..engine.records import encode
from ..engine.tools import Safety, Tool, ToolContext, checked_options
from . import tasks
from .connection import Connection, http_transport
from .elicitation import Asker, callback, check_option
from .errors import require_sdk
from .progress import ProgressNotes

_SERVER_NAME = re.compile(r"[A-Za-z0-9-]{1,32}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SEPARATOR = "__"
SAFETY_CLASSES = ("read_only", "idempotent", "side_effect")


@dataclass(frozen=True)
class ToolOptions:
    """What this site decides about one of a server's tools, whatever the server declares.

    ``safety``: ``"read_only"``, ``"idempotent"`` or ``"side_effect"`` (None: the server's
    annotations if trusted, else a side effect). ``approval``: True for one staff decision,
    or a ``da.Quorum`` / ``da.Rules`` policy. ``elicitation``: whether the server's
    questions during a call go to staff (None: the server's ``elicitation=``). The rest are
    ``@da.tool``'s options, checked the same way."""

    safety: str | None = None
    approval: Any = None
    editable: bool = True
    summary: Callable[[dict[str, Any]], str] | None = None
    identifying: Sequence[str] = ()
    sensitive: Sequence[str] = ()
    rate: str | None = None
    max_concurrent: int | None = None
    deadline: Any = None
    elicitation: bool | None = None


@dataclass(frozen=True)
class Timeouts:
    connect: float
    list: float
    call: float
    task: float


class Server:
    """An MCP server: ``Server("crm", command=["crm-mcp", "--stdio"], env={...})`` starts it
    as a subprocess (stdio); ``Server("tickets", url="https://…/mcp", headers={...})``
    talks streamable HTTP. Tools are named ``<server>__<tool>`` unless ``names=`` maps a
    remote name to another; ``tools={"refund": ToolOptions(...)}`` sets a tool's class,
    approval and limits; ``trust_annotations=True`` takes the server's read-only and
    idempotent hints as the class; ``elicitation=True`` lets staff answer the server's
    questions during a call (docs/mcp.md)."""

    def __init__(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        trust_annotations: bool = False,
        tools: Mapping[str, ToolOptions] | None = None,
        names: Mapping[str, str] | None = None,
        idempotency_key_argument: str | None = "idempotency_key",
        connect_timeout: float | None = None,
        list_timeout: float | None = None,
        call_timeout: float | None = None,
        task_timeout: float | None = None,
        elicitation: bool = False,
    ) -> None:
        what = f"MCP server {name!r}"
        if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
            raise ConfigError(
                f"{what}: a server's name is 1-32 characters of A-Za-z0-9- (it prefixes its "
                "tools' names, which providers limit to A-Za-z0-9_-)",
                code="config.mcp_server",
            )
        if (command is None) == (url is None):
            raise ConfigError(
                f"{what}: give command=[...] (stdio) or url=... (streamable HTTP), one of them",
                code="config.mcp_server",
            )
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise ConfigError(
                f"{what}: command is a list of strings, e.g. ['python', '-m', 'crm_mcp']",
                code="config.mcp_server",
            )
        if url is not None and not (
            isinstance(url, str) and url.startswith(("http://", "https://"))
        ):
            raise ConfigError(f"{what}: url must be an http(s) URL", code="config.mcp_server")
        for label, mapping in (("env", env), ("headers", headers), ("names", names)):
            if mapping is not None and not (
                isinstance(mapping, Mapping)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())
            ):
                raise ConfigError(
                    f"{what}: {label} must be a dict of strings", code="config.mcp_server"
                )
        for remote, opts in (tools or {}).items():
            if not isinstance(opts, ToolOptions):
                raise ConfigError(
                    f"{what}: tools[{remote!r}] must be a durable_agents.mcp.ToolOptions(...)",
                    code="config.mcp_server",
                )
        check_option(what, elicitation)
        for remote, opts in (tools or {}).items():
            if opts.elicitation is not None:
                check_option(f"tool {remote!r} of {what}", opts.elicitation)
        if not isinstance(trust_annotations, bool):
            raise ConfigError(
                f"{what}: trust_annotations must be True or False", code="config.mcp_server"
            )
        self.name = name
        self.command = list(command) if command is not None else None
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.url = url
        self.headers = dict(headers or {})
        self.trust_annotations = trust_annotations
        self.elicitation = elicitation
        self.options = dict(tools or {})
        self.names = dict(names or {})
        self.key_argument = idempotency_key_argument
        self._timeouts = (connect_timeout, list_timeout, call_timeout, task_timeout)
        for label, value in zip(("connect", "list", "call", "task"), self._timeouts, strict=True):
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ConfigError(
                    f"{what}: {label}_timeout must be a positive number of seconds",
                    code="config.mcp_server",
                )
        # Checked now, so a bad option fails at import, not at the first drive.
        for remote, opts in self.options.items():
            _options_safety(f"tool {remote!r} of {what}", opts, None)
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<mcp.Server {self.name}>"

    def where(self) -> str:
        """Where the server is, for error messages (no headers: they may hold secrets)."""
        return f"command {self.command[0]!r}" if self.command else f"url {self.url}"

    def timeouts(self) -> Timeouts:
        """This server's timeouts: its own, else ``DURABLE_AGENTS["MCP_TIMEOUTS"]``."""
        try:
            from ..conf import get_settings

            defaults = get_settings().mcp_timeouts
            base = (defaults.connect, defaults.list, defaults.call, defaults.task)
        except Exception:  # Django not configured: the documented defaults
            base = (10.0, 10.0, 60.0, 3600.0)
        own = self._timeouts
        return Timeouts(*(float(o if o is not None else b) for o, b in zip(own, base, strict=True)))

    def connection(self) -> Connection:
        with self._lock:
            if self._connection is None:
                self._connection = Connection(self)
            return self._connection

    def close(self) -> None:
        """Close this process's connection (a stdio server's process ends)."""
        if self._connection is not None:
            self._connection.close()

    def client(self) -> Any:
        """A new, unopened ``mcp.Client`` for this server."""
        require_sdk()
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        t = self.timeouts()
        target: Any
        if self.command is not None:
            params = StdioServerParameters(
                command=self.command[0], args=self.command[1:], env=self.env, cwd=self.cwd
            )
            target = stdio_client(params, errlog=_server_stderr())
        else:
            assert self.url is not None
            target = http_transport(self.url, self.headers, t.connect, t.call + t.connect)
        return Client(target, cache=None, elicitation_callback=callback(self))

    def declared_limits(self) -> list[tuple[str, Any, int | None]]:
        """The limits this site sets on the server's tools (``tools={...: ToolOptions(rate=,
        max_concurrent=)}``), by the agent-side name, without connecting: what the limits
        page lists, whether the server is up or not (a tool ``tools=`` names that the server
        does not list is refused when the tools are listed)."""
        found = []
        for remote, opts in sorted(self.options.items()):
            _, rate, concurrent, _, _ = _options_safety(f"tool {remote!r}", opts, None)
            if rate is not None or concurrent is not None:
                local = self.names.get(remote, f"{self.name}{SEPARATOR}{remote}")
                found.append((local, rate, concurrent))
        return found

    def load_tools(self) -> list[Tool]:
        """The server's tools as durable tools (connecting if needed)."""
        require_sdk()
        connection = self.connection()
        listed = connection.list_tools()
        runs_tasks = tasks.server_runs_tasks(connection.capabilities())
        remote_names = [t.name for t in listed]
        for label, keys in (("tools", self.options), ("names", self.names)):
            unknown = sorted(set(keys) - set(remote_names))
            if unknown:
                raise ConfigError(
                    f"MCP server {self.name!r}: {label}= names {unknown}, which the server "
                    f"does not list (it lists {sorted(remote_names)})",
                    code="config.mcp_server",
                )
        made: dict[str, Tool] = {}
        for remote in listed:
            local = self.names.get(remote.name, f"{self.name}{SEPARATOR}{remote.name}")
            if not _TOOL_NAME.fullmatch(local):
                raise ConfigError(
                    f"MCP server {self.name!r}: its tool {remote.name!r} would be named "
                    f"{local!r}, which providers refuse (1-64 of A-Za-z0-9_-); give it a "
                    f"name with names={{{remote.name!r}: '...'}}",
                    code="config.tool_name",
                )
            if local in made:
                raise ConfigError(
                    f"MCP server {self.name!r}: two of its tools would be named {local!r}; "
                    "tell them apart with names={...}",
                    code="config.tool_name",
                )
            made[local] = McpTool(self, remote, local, runs_tasks=runs_tasks)
        return list(made.values())


def _server_stderr() -> Any:
    """Where a stdio server's stderr goes: this process's, unless it is no file (a Celery
    worker replaces ``sys.stderr`` with a logging proxy, which a subprocess cannot write
    to): then the stderr the process started with."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__


def _options_safety(
    what: str, opts: ToolOptions | None, declared: str | None
) -> tuple[Safety, Any, Any, str, str]:
    """The tool's checked ``Safety``, rate and concurrency, its class and where the class
    came from (``override``, ``annotations``, ``default``)."""
    opts = opts or ToolOptions()
    if opts.safety is not None and opts.safety not in SAFETY_CLASSES:
        raise ConfigError(
            f"{what}: safety is one of {SAFETY_CLASSES}, not {opts.safety!r}",
            code="config.tool_safety",
        )
    if opts.safety is not None:
        chosen, source = opts.safety, "override"
    elif declared is not None:
        chosen, source = declared, "annotations"
    else:
        chosen, source = "side_effect", "default"
    approval = opts.approval
    if approval is not None and not isinstance(approval, bool):
        gate: dict[str, Any] = {"approval": approval}
    else:
        gate = {"requires_approval": bool(approval)}
    safety, rate, concurrent = checked_options(
        what,
        read_only=chosen == "read_only",
        idempotent=chosen == "idempotent",
        editable=opts.editable,
        summary=opts.summary,
        rate=opts.rate,
        max_concurrent=opts.max_concurrent,
        deadline=opts.deadline,
        **gate,
    )
    return safety, rate, concurrent, chosen, source


def declared_class(annotations: Any) -> str | None:
    """The class a server's annotations declare: ``readOnlyHint`` → read_only;
    ``idempotentHint`` with ``destructiveHint`` false → idempotent (the spec's default for
    ``destructiveHint`` is true, so it must be said); else None."""
    if annotations is None:
        return None
    if annotations.read_only_hint is True:
        return "read_only"
    if annotations.idempotent_hint is True and annotations.destructive_hint is False:
        return "idempotent"
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class McpTool(Tool):
    """One tool of an MCP server: the server's schema, validated here before any call
    (a call with bad arguments never reaches the server), its result journaled whole."""

    # A call with a journaled task id is resumed by polling that task (``mcp.tasks``).
    resumes = True

    def __init__(
        self, server: Server, remote: Any, local: str, *, runs_tasks: bool = False
    ) -> None:
        import jsonschema

        self.server = server
        self.remote = remote.name
        self.name = local
        what = f"tool {remote.name!r} of MCP server {server.name!r}"
        annotations = remote.annotations
        declared = declared_class(annotations) if server.trust_annotations else None
        opts = server.options.get(remote.name)
        self.safety, self.rate, self.max_concurrent, chosen, source = _options_safety(
            what, opts, declared
        )
        self.elicitation = (
            opts.elicitation
            if opts is not None and opts.elicitation is not None
            else server.elicitation
        )
        schema = dict(remote.input_schema or {"type": "object"})
        properties = dict(schema.get("properties") or {})
        # The engine's per-call key goes in this argument: the model never sees or fills it.
        self.key_argument = (
            server.key_argument
            if server.key_argument and server.key_argument in properties
            else None
        )
        if self.key_argument is not None:
            properties.pop(self.key_argument)
            schema["properties"] = properties
            if "required" in schema:
                schema["required"] = [r for r in schema["required"] if r != self.key_argument]
        # As strict as a Python tool's (pydantic's extra="forbid"): an argument the schema
        # does not name is refused unless the schema allows others itself.
        if schema.get("type") == "object" and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        try:
            validator_class = jsonschema.validators.validator_for(schema)
            validator_class.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(
                f"{what}: its input schema is not a valid JSON schema ({exc.message})",
                code="config.tool_signature",
            ) from None
        self._validator = validator_class(schema)
        self.parameters = schema
        self.description = (remote.description or remote.title or "").strip()
        self.fn = self._direct
        self.context_param = None
        self.summary = opts.summary if opts else None
        self.sensitive = self._argument_names(
            "sensitive", opts.sensitive if opts else (), "config.tool_sensitive"
        )
        self.identifying = self._argument_names(
            "identifying", opts.identifying if opts else (), "config.tool_identifying"
        )
        declared_annotations = (
            annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
            if annotations is not None
            else None
        )
        # What the server says the tool is; the site's own choices (its options, trusting the
        # annotations) are its deploys, as a Python tool's flags are, and are not in it.
        self.definition_digest = hashlib.sha256(
            encode(
                {
                    "server": server.name,
                    "tool": remote.name,
                    "title": remote.title,
                    "description": remote.description,
                    "input_schema": remote.input_schema,
                    "annotations": declared_annotations,
                }
            ).encode()
        ).hexdigest()[:16]
        self.origin = {
            "kind": "mcp",
            "server": server.name,
            "transport": "stdio" if server.command else "http",
            "remote_tool": remote.name,
            "annotations": declared_annotations,
            "trusted": server.trust_annotations,
            "class": chosen,
            "class_from": source,
            "idempotency_key_argument": self.key_argument,
            "elicitation": self.elicitation,
            "task_support": tasks.task_support(remote),
            "definition_digest": self.definition_digest,
        }
        # Called as a task when the server runs tool calls as tasks and the tool allows it.
        self.as_task = runs_tasks and tasks.task_support(remote) is not None
        self.origin["as_task"] = self.as_task

    def _argument_names(self, option: str, names: Sequence[str], code: str) -> tuple[str, ...]:
        known = list((self.parameters.get("properties") or {}).keys())
        if isinstance(names, str) or not all(isinstance(f, str) for f in names):
            raise ConfigError(
                f"tool {self.name}: {option} must be a list of argument names", code=code
            )
        unknown = [f for f in names if f not in known]
        if unknown:
            raise ConfigError(
                f"tool {self.name}: {option} names {', '.join(map(repr, unknown))}, which is "
                f"not an argument of the tool (its arguments: {', '.join(known) or 'none'})",
                code=code,
            )
        return tuple(dict.fromkeys(names))

    # ``Tool.validate`` parses, takes the JSON form and checks it reads back the same; here
    # the parsed form is the JSON object itself, checked against the server's schema.
    def _parse(self, text: str) -> Any:
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {exc}") from None
        if not isinstance(data, dict):
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: arguments: must be a JSON object"
            )
        # An argument left out is the schema's default, filled here as a Python tool's
        # signature fills it: what is journaled and approved is what the server will run
        # with, so a server whose next version adds a defaulted argument asks a pending
        # approval again instead of running what nobody saw.
        for key, prop in (self.parameters.get("properties") or {}).items():
            if key not in data and isinstance(prop, dict) and "default" in prop:
                data[key] = copy.deepcopy(prop["default"])
        errors = sorted(self._validator.iter_errors(data), key=lambda e: [str(p) for p in e.path])
        if errors:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}" for e in errors
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}")
        return data

    def _json_form(self, model: Any) -> tuple[dict[str, Any], str]:
        return model, encode(model)

    def values(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return dict(args)

    def invoke(self, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Call the remote tool; its result whole (content blocks, ``structuredContent``).
        An ``isError`` result is raised as ``ToolResultError``: the model reads it as an
        error, journaled whole."""
        sent = dict(args)
        if self.key_argument is not None:
            sent[self.key_argument] = ctx.idempotency_key
        asker = Asker(
            allowed=self.elicitation,
            what=f"MCP server {self.server.name!r}, tool {self.remote!r}",
            waits=ctx._waits,
            call_timeout=self.server.timeouts().call,
        )
        notes = ProgressNotes(ctx)
        if self.as_task or ctx.handle() is not None:
            # A task journaled before a crash is polled again whatever the server lists now.
            # (Its elicitations are not served: a task's questions come through tasks/get,
            # which this client does not answer.)
            return tasks.call(self.server.connection(), self.remote, sent, ctx, notes)
        result = self.server.connection().call(self.remote, sent, notes, asker)
        data = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        if result.is_error:
            raise ToolResultError(
                f"MCP tool {self.remote!r} of server {self.server.name!r} answered with an error",
                data,
            )
        return data

    def _direct(self, **kwargs: Any) -> Any:
        """Calling the tool outside a run (tests, a shell): no journal, no key; a task is
        polled to its end, its id kept nowhere."""
        if self.as_task:
            ctx = ToolContext(run_id="", call_id="", tool_name=self.name, idempotency_key="")
            return tasks.call(self.server.connection(), self.remote, kwargs, ctx)
        return (
            self.server.connection()
            .call(self.remote, kwargs)
            .model_dump(mode="json", by_alias=True, exclude_none=True)
        )

    def __repr__(self) -> str:
        return f"<McpTool {self.name} ({self.server.name}:{self.remote})>"
