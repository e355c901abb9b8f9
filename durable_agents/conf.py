"""One typed settings object, read from the ``DURABLE_AGENTS`` dict in Django settings.

Defaults live here and nowhere else. Settings are read when asked for (never at import
time), and ``durable_agents.checks`` validates them at startup with a fix-it hint.
"""

from __future__ import annotations

import base64
import copy
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .engine import events
from .engine.errors import ConfigError
from .engine.limits import Rate, parse_rate
from .engine.retry import RetryPolicy

# Where the reference docs live for people who installed the wheel (it does not carry docs/).
DOCS_URL = "https://github.com/durable-agents/durable-agents/blob/main/docs/"

DISPATCH_MODES = ("celery", "inline")
DRIFT_POLICIES = ("warn", "error", "ignore")

# An HMAC-SHA256 key shorter than this is guessable offline from one signed delivery.
MIN_WEBHOOK_SECRET = 32
# Length is no strength when the characters are few or repeat a pattern: "aaaa…", a word
# repeated to reach the length. Generated secrets never come close (token_hex(16) has fewer
# than 8 distinct characters about once in 28 million).
MIN_WEBHOOK_SECRET_DISTINCT = 8

__all__ = [
    "ChannelConfig",
    "Notify",
    "Retention",
    "RetryPolicy",
    "Settings",
    "get_settings",
    "parse",
    "parse_webhook_secrets",
]


# The facts of an approval request a channel may be told (docs/notifications.md).
NOTIFY_EVENTS = (
    events.APPROVAL_REQUESTED,
    events.APPROVAL_REMINDED,
    events.APPROVAL_ESCALATED,
    events.APPROVAL_EXPIRED,
    events.APPROVAL_DECIDED,
)
CHANNEL_KINDS = ("email", "webhook")
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclass(frozen=True)
class ChannelConfig:
    """One entry of ``NOTIFY["CHANNELS"]``: where notifications of ``events`` go."""

    name: str
    kind: str  # "email", "webhook", or the dotted path of a channel of the site's own
    events: tuple[str, ...] = NOTIFY_EVENTS
    # Add a one-line human ``text`` field to the payload (Slack and Teams incoming
    # webhooks show ``{"text": ...}``).
    text: bool = False
    url: str = ""  # webhook: where to POST
    secret_setting: str = ""  # webhook: the Django setting holding the signing secret(s)
    timeout: float = 10.0  # webhook: seconds to wait for the receiver's answer
    # A channel of the site's own: every other key of its entry, as given.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Notify:
    """``NOTIFY``: who is told what, through which channels (``durable_agents.notifications``,
    docs/notifications.md)."""

    # The shorthand of 0.1: email the eligible approvers when a call starts waiting (an
    # email channel for ``approval_requested``). Unused with ``CHANNELS``.
    approvals: bool = False
    # The sender; None: Django's DEFAULT_FROM_EMAIL.
    from_email: str | None = None
    # The site's address as approvers reach it ("https://ops.example.com"): notifications
    # are sent by workers, which have no request to build a link from.
    base_url: str = ""
    channels: tuple[ChannelConfig, ...] = ()
    interval: float = 10.0  # seconds between delivery passes (Celery beat)
    max_attempts: int = 12  # tries of one notification before it is given up (failed)
    base_delay: float = 30.0  # seconds before the second try; doubled each time after
    max_delay: float = 3600.0  # the longest wait between two tries
    # How far back the reconciling pass looks for decided or expired requests (seconds).
    window: float = 86400.0
    batch: int = 100  # requests of each kind a reconciling pass reads; rows a channel sends


@dataclass(frozen=True)
class Retention:
    """``RETENTION``: the beat task ``durable_agents.tasks.prune`` (docs/retention.md)."""

    finished_for: float  # days a run stays after it finished
    by: str  # the username the prune acts as (it needs delete_run)
    export_dir: str | None  # None, said explicitly: tombstones only
    batch: int = 500
    every: float = 3600.0  # seconds between prunes


@dataclass(frozen=True)
class McpTimeouts:
    """``MCP_TIMEOUTS``: seconds an MCP server gets to connect, to list its tools, to
    answer one call, and to finish a call it runs as a task, counted from when the task was
    created, across crashes (``durable_agents.mcp``; a ``Server`` may set its own)."""

    connect: float = 10.0
    list: float = 10.0
    call: float = 60.0
    task: float = 3600.0


@dataclass(frozen=True)
class Settings:
    agents: tuple[str, ...] = ()
    dispatch: str = "celery"
    lease_ttl: float = 30.0
    recovery_interval: float = 15.0
    # Seconds between sweeps waking due timers (a lost ETA message is late by at most this).
    timer_sweep_interval: float = 5.0
    # Seconds between keep-alive comments on an event stream with no news (``events``).
    events_keepalive: float = 15.0
    on_drift: str = "warn"
    celery_queue: str = "durable_agents"
    database: str = "default"
    # None: on, unless DATABASE goes through a transaction pooler (``use_prepared``).
    prepared_statements: bool | None = None
    # PostgreSQL: a driver's process that died gives its runs up at once (a session-level
    # advisory lock per lease); off behind poolers that cannot hold session locks.
    instant_takeover: bool = True
    # DATABASE reaches PostgreSQL through a transaction pooler (PgBouncer's
    # pool_mode = transaction): no session state may be kept on its connections.
    transaction_pooling: bool = False
    # An alias that reaches the same database without the pooler: the session state
    # (liveness locks, LISTEN) lives there. None: the DATABASE alias itself.
    direct_database: str | None = None
    public_api_docs: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    halt_min_age: float | None = None  # None: twice LEASE_TTL
    notify: Notify = field(default_factory=Notify)
    # How many levels of sub-runs (``agent.as_tool()``) a tree may have below its root.
    subagent_depth: int = 5
    # Runs whose audit chains a system check verifies (the most recently updated); 0: off.
    audit_check_sample: int = 0
    # PEM text of the site's Ed25519 private key that signs run heads (docs/audit.md).
    audit_signing_key: str | None = None
    # The secret sensitive values' salted hashes derive from (docs/audit.md); None: SECRET_KEY.
    audit_salt_key: str | None = None
    # The shared secrets inbound webhooks are signed with (``durable_agents.webhooks``); more
    # than one while a sender rotates its secret. Empty: no webhook view can be built.
    webhook_secrets: tuple[str, ...] = ()
    # Why ``WEBHOOK_SECRET`` is unusable ("": it is fine or unset). Not an E001: the rest of
    # the site works without it, and ``migrate`` must run before secrets are in place; the
    # check durable_agents.E008 reports it, and a webhook answers 503 meanwhile.
    webhook_secret_problem: str = ""
    # Ed25519 public keys (raw 32 bytes, base64) whose signed heads vouch for an imported
    # run's chain (docs/audit.md, "Imported runs"); the site's own signing key counts too.
    trusted_audit_keys: tuple[str, ...] = ()
    # The scheduled prune (``durable_agents.tasks.prune``); None: off.
    retention: Retention | None = None
    # Model calls per period a site allows, by model id or provider name (docs/limits.md).
    model_rates: Mapping[str, Rate] = field(default_factory=dict)
    # Spans and metrics through OpenTelemetry (``durable_agents.otel``); off: nothing
    # of OpenTelemetry is imported.
    telemetry: bool = False
    # Tools from MCP servers: how long a server gets before it is an error (docs/mcp.md).
    mcp_timeouts: McpTimeouts = field(default_factory=McpTimeouts)

    @property
    def use_prepared(self) -> bool:
        """Whether the store prepares its hot statements server-side: by default not
        behind a transaction pooler (PgBouncer before 1.21 cannot route them)."""
        if self.prepared_statements is None:
            return not self.transaction_pooling
        return self.prepared_statements

    @property
    def use_instant_takeover(self) -> bool:
        """Whether a dead driver's run is taken at once: behind a transaction pooler only
        with a ``DIRECT_DATABASE`` to hold the locks on (else by lease expiry)."""
        if not self.instant_takeover:
            return False
        return not self.transaction_pooling or self.direct_database is not None

    @property
    def effective_halt_min_age(self) -> float:
        """Seconds a halt must have aged (by the database clock) before it may be resolved."""
        return 2 * self.lease_ttl if self.halt_min_age is None else self.halt_min_age


_KEYS = {
    "AGENTS": "agents",
    "DISPATCH": "dispatch",
    "LEASE_TTL": "lease_ttl",
    "RECOVERY_INTERVAL": "recovery_interval",
    "TIMER_SWEEP_INTERVAL": "timer_sweep_interval",
    "EVENTS_KEEPALIVE": "events_keepalive",
    "ON_DRIFT": "on_drift",
    "CELERY_QUEUE": "celery_queue",
    "DATABASE": "database",
    "PREPARED_STATEMENTS": "prepared_statements",
    "INSTANT_TAKEOVER": "instant_takeover",
    "TRANSACTION_POOLING": "transaction_pooling",
    "DIRECT_DATABASE": "direct_database",
    "PUBLIC_API_DOCS": "public_api_docs",
    "RETRY": "retry",
    "HALT_MIN_AGE": "halt_min_age",
    "NOTIFY": "notify",
    "SUBAGENT_DEPTH": "subagent_depth",
    "AUDIT_CHECK_SAMPLE": "audit_check_sample",
    "AUDIT_SIGNING_KEY": "audit_signing_key",
    "AUDIT_SALT_KEY": "audit_salt_key",
    "WEBHOOK_SECRET": "webhook_secrets",
    "TRUSTED_AUDIT_KEYS": "trusted_audit_keys",
    "RETENTION": "retention",
    "MODEL_RATES": "model_rates",
    "TELEMETRY": "telemetry",
    "MCP_TIMEOUTS": "mcp_timeouts",
}
_MCP_TIMEOUT_KEYS = {"CONNECT": "connect", "LIST": "list", "CALL": "call", "TASK": "task"}
_RETRY_KEYS = {"MAX_ATTEMPTS": "max_attempts", "BASE_DELAY": "base_delay", "MAX_DELAY": "max_delay"}
_NOTIFY_KEYS = {
    "APPROVALS": "approvals",
    "FROM_EMAIL": "from_email",
    "BASE_URL": "base_url",
    "CHANNELS": "channels",
    "INTERVAL": "interval",
    "MAX_ATTEMPTS": "max_attempts",
    "BASE_DELAY": "base_delay",
    "MAX_DELAY": "max_delay",
    "WINDOW": "window",
    "BATCH": "batch",
}
_CHANNEL_KEYS = {
    "email": ("kind", "name", "events", "text"),
    "webhook": ("kind", "name", "events", "text", "url", "secret_setting", "timeout"),
}
_RETENTION_KEYS = {
    "FINISHED_FOR": "finished_for",
    "BY": "by",
    "EXPORT_DIR": "export_dir",
    "BATCH": "batch",
    "EVERY": "every",
}


def _suggest(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _positive(name: str, value: Any, problems: list[str]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        problems.append(f"DURABLE_AGENTS[{name!r}] must be a positive number, not {value!r}")
        return 1.0
    return float(value)


def parse(raw: Any) -> tuple[Settings, list[str]]:
    """Build ``Settings`` from the raw dict; return it with the list of problems found."""
    problems: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return Settings(), [f"DURABLE_AGENTS must be a dict, not {type(raw).__name__}"]
    values = _known_keys(raw, problems)
    # Each check drops the values it refuses (their defaults stand) and says why, in order.
    _check_running(values, problems)
    _check_database(values, problems)
    _check_audit(values, problems)
    _check_switches(values, problems)
    values["retry"] = _parse_retry(values.pop("retry", None), problems)
    values["mcp_timeouts"] = _parse_mcp_timeouts(values.pop("mcp_timeouts", None), problems)
    values["notify"] = _parse_notify(values.pop("notify", None), problems)
    values["retention"] = _parse_retention(values.pop("retention", None), problems)
    values["model_rates"] = _parse_model_rates(values.pop("model_rates", None), problems)

    settings = Settings(**values)
    if settings.lease_ttl < 1:
        problems.append("DURABLE_AGENTS['LEASE_TTL'] must be at least 1 second")
    return settings, problems


def _known_keys(raw: dict[Any, Any], problems: list[str]) -> dict[str, Any]:
    """The raw dict's values by ``Settings`` field; an unknown key is a problem."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _KEYS:
            problems.append(f"unknown key DURABLE_AGENTS[{key!r}]{_suggest(str(key), _KEYS)}")
            continue
        values[_KEYS[key]] = value
    return values


def _check_running(values: dict[str, Any], problems: list[str]) -> None:
    """The agents, how runs are driven and for how long."""
    agents = values.get("agents", ())
    if isinstance(agents, str):
        agents = (agents,)
    if not isinstance(agents, list | tuple) or not all(isinstance(a, str) for a in agents):
        problems.append("DURABLE_AGENTS['AGENTS'] must be a list of dotted paths")
        agents = ()
    values["agents"] = tuple(agents)

    if values.get("dispatch", "celery") not in DISPATCH_MODES:
        problems.append(
            f"DURABLE_AGENTS['DISPATCH'] must be one of {DISPATCH_MODES}, "
            f"not {values['dispatch']!r}"
        )
        values.pop("dispatch")
    if values.get("on_drift", "warn") not in DRIFT_POLICIES:
        problems.append(
            f"DURABLE_AGENTS['ON_DRIFT'] must be one of {DRIFT_POLICIES}, "
            f"not {values['on_drift']!r}"
        )
        values.pop("on_drift")
    for key in ("lease_ttl", "recovery_interval", "timer_sweep_interval", "events_keepalive"):
        if key in values:
            values[key] = _positive(key.upper(), values[key], problems)
    for key in ("celery_queue", "database"):
        if key in values and (not isinstance(values[key], str) or not values[key]):
            problems.append(f"DURABLE_AGENTS[{key.upper()!r}] must be a non-empty string")
            values.pop(key)

    if values.get("halt_min_age") is not None:
        age = values["halt_min_age"]
        if isinstance(age, bool) or not isinstance(age, int | float) or not 0 <= age < 10**9:
            problems.append(
                "DURABLE_AGENTS['HALT_MIN_AGE'] must be a number of seconds >= 0 (or None for "
                f"twice LEASE_TTL), not {age!r}"
            )
            values.pop("halt_min_age")
        else:
            values["halt_min_age"] = float(age)

    depth = values.get("subagent_depth", 5)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 50:
        problems.append(
            f"DURABLE_AGENTS['SUBAGENT_DEPTH'] must be an int from 1 to 50, not {depth!r}"
        )
        values.pop("subagent_depth")


def _check_database(values: dict[str, Any], problems: list[str]) -> None:
    """Instant takeover, the pooler, prepared statements and the direct connection."""
    for key in ("instant_takeover", "transaction_pooling"):
        if not isinstance(values.get(key, True), bool):
            problems.append(f"DURABLE_AGENTS[{key.upper()!r}] must be True or False")
            values.pop(key)
    if not isinstance(values.get("prepared_statements"), bool | None):
        problems.append(
            "DURABLE_AGENTS['PREPARED_STATEMENTS'] must be True, False or None (on unless "
            "TRANSACTION_POOLING)"
        )
        values.pop("prepared_statements")
    direct = values.get("direct_database")
    if direct is not None:
        wrong = _direct_problems(direct, values.get("database", "default"))
        if wrong:
            problems += wrong
            values.pop("direct_database")


def _check_audit(values: dict[str, Any], problems: list[str]) -> None:
    """The audit check, its keys and the webhook secrets."""
    sample = values.get("audit_check_sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        problems.append(
            f"DURABLE_AGENTS['AUDIT_CHECK_SAMPLE'] must be a number of runs >= 0, not {sample!r}"
        )
        values.pop("audit_check_sample")

    signing_key = values.get("audit_signing_key")
    if signing_key is not None and not (
        isinstance(signing_key, str) and "PRIVATE KEY" in signing_key
    ):
        problems.append(
            "DURABLE_AGENTS['AUDIT_SIGNING_KEY'] must be the PEM text of an Ed25519 private key "
            "(-----BEGIN PRIVATE KEY-----…), or None"
        )
        values.pop("audit_signing_key")

    salt_key = values.get("audit_salt_key")
    if salt_key is not None and not (isinstance(salt_key, str) and salt_key):
        problems.append(
            "DURABLE_AGENTS['AUDIT_SALT_KEY'] must be a secret string, or None (SECRET_KEY)"
        )
        values.pop("audit_salt_key")

    secrets, secret_problems = parse_webhook_secrets(
        values.get("webhook_secrets"), "DURABLE_AGENTS['WEBHOOK_SECRET']"
    )
    values["webhook_secret_problem"] = secret_problems[0] if secret_problems else ""
    values["webhook_secrets"] = secrets
    values["trusted_audit_keys"] = _parse_trusted_keys(values.get("trusted_audit_keys"), problems)


def _check_switches(values: dict[str, Any], problems: list[str]) -> None:
    """``TELEMETRY`` and ``PUBLIC_API_DOCS``."""
    telemetry = values.get("telemetry", False)
    if not isinstance(telemetry, bool):
        problems.append("DURABLE_AGENTS['TELEMETRY'] must be True or False")
        values.pop("telemetry")
    elif telemetry and not _otel_installed():
        problems.append(
            "DURABLE_AGENTS['TELEMETRY'] is on but OpenTelemetry is not installed: "
            "pip install 'durable-agents[otel]' (opentelemetry-api and opentelemetry-sdk), or "
            "turn TELEMETRY off"
        )

    if not isinstance(values.get("public_api_docs", False), bool):
        problems.append("DURABLE_AGENTS['PUBLIC_API_DOCS'] must be True or False")
        values.pop("public_api_docs")


def _parse_retry(raw: Any, problems: list[str]) -> RetryPolicy:
    """``RETRY``: a dict of ``MAX_ATTEMPTS``, ``BASE_DELAY``, ``MAX_DELAY``."""
    retry_raw = raw or {}
    retry_values: dict[str, Any] = {}
    if not isinstance(retry_raw, dict):
        problems.append("DURABLE_AGENTS['RETRY'] must be a dict")
        retry_raw = {}
    for key, value in retry_raw.items():
        if key not in _RETRY_KEYS:
            problems.append(
                f"unknown key DURABLE_AGENTS['RETRY'][{key!r}]{_suggest(str(key), _RETRY_KEYS)}"
            )
            continue
        if key == "MAX_ATTEMPTS":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append("DURABLE_AGENTS['RETRY']['MAX_ATTEMPTS'] must be an int >= 1")
                continue
            retry_values["max_attempts"] = value
        else:
            retry_values[_RETRY_KEYS[key]] = _positive(f"RETRY.{key}", value, problems)
    return RetryPolicy(**retry_values)


def _parse_model_rates(raw: Any, problems: list[str]) -> Mapping[str, Rate]:
    """``MODEL_RATES``: ``{"openai": "500/m", "anthropic:claude-sonnet-4-5": "50/s"}``."""
    if raw is None:
        return {}
    where = "DURABLE_AGENTS['MODEL_RATES']"
    if not isinstance(raw, Mapping):
        problems.append(
            f"{where} must be a dict of a provider ('openai') or a model id ('openai:gpt-4o') "
            "to a rate ('500/m')"
        )
        return {}
    rates = {}
    for name, text in raw.items():
        if not isinstance(name, str) or not name:
            problems.append(f"{where} has the key {name!r}; use a provider or a model id")
            continue
        try:
            rates[name] = parse_rate(text, f"{where}[{name!r}]")
        except ConfigError as exc:
            problems.append(str(exc))
    return rates


def _otel_installed() -> bool:
    """Whether ``opentelemetry-api`` can be imported (found, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):
        return False


def _direct_problems(direct: Any, database: Any) -> list[str]:
    """``DIRECT_DATABASE``: another alias of ``DATABASES``, reaching the same database."""
    from django.conf import settings as django_settings

    where = "DURABLE_AGENTS['DIRECT_DATABASE']"
    if not isinstance(direct, str) or not direct:
        return [f"{where} must be the alias of a database in DATABASES, or None"]
    aliases = getattr(django_settings, "DATABASES", {}) or {}
    if direct not in aliases:
        return [
            f"{where} is {direct!r}, which is not in DATABASES{_suggest(direct, aliases)}: "
            "add an alias that reaches the same PostgreSQL database without the pooler"
        ]
    if direct == database:
        return [
            f"{where} is {direct!r}, the DATABASE alias itself: it must reach the same "
            "database without the pooler (another alias, or None)"
        ]
    engine = str(aliases[direct].get("ENGINE", ""))
    if "postgresql" not in engine:
        return [f"{where} is {direct!r}, which is not a PostgreSQL database ({engine})"]
    return []


def parse_webhook_secrets(raw: Any, where: str) -> tuple[tuple[str, ...], list[str]]:
    """A webhook secret setting (``where`` names it in messages): None (unset), one secret,
    or a list of them (the first is current; the others still verify while a sender
    rotates). Each is at least ``MIN_WEBHOOK_SECRET`` characters."""
    if raw is None:
        return (), []
    listed = [raw] if isinstance(raw, str) else raw
    fix = (
        f"at least {MIN_WEBHOOK_SECRET} characters and no obvious pattern, e.g. from python -c "
        "'import secrets; print(secrets.token_urlsafe(32))'"
    )
    if (
        not isinstance(listed, list | tuple)
        or not listed
        or not all(isinstance(s, str) for s in listed)
    ):
        return (), [
            f"{where} must be a secret string (or a list of them while you rotate), {fix}; "
            f"not {type(raw).__name__}"
        ]
    short = [i for i, s in enumerate(listed) if len(s) < MIN_WEBHOOK_SECRET]
    if short:
        which = "" if isinstance(raw, str) else f" (entry {short[0]})"
        return (), [f"{where}{which} is too short: a webhook secret must be {fix}"]
    for i, secret in enumerate(listed):
        why = weak_secret(secret)
        if why:
            which = "" if isinstance(raw, str) else f" (entry {i})"
            return (), [f"{where}{which} is too weak: {why}; a webhook secret must be {fix}"]
    return tuple(listed), []


def weak_secret(secret: str) -> str:
    """Why ``secret`` is obviously guessable whatever its length ("" when it is not): fewer
    than ``MIN_WEBHOOK_SECRET_DISTINCT`` distinct characters, or a pattern repeated at least
    twice over (its shortest period is at most half its length). Says how, never what."""
    distinct = len(set(secret))
    if distinct < MIN_WEBHOOK_SECRET_DISTINCT:
        plural = "" if distinct == 1 else "s"
        return (
            f"it has only {distinct} distinct character{plural} (at least "
            f"{MIN_WEBHOOK_SECRET_DISTINCT})"
        )
    period = _shortest_period(secret)
    if period <= len(secret) // 2:
        return f"it repeats a pattern of {period} characters"
    return ""


def _shortest_period(text: str) -> int:
    """The least p with text[i] == text[i + p] for every i (len(text) when there is none
    shorter): the failure function of Knuth-Morris-Pratt, linear in the length."""
    border = [0] * len(text)
    k = 0
    for i in range(1, len(text)):
        while k and text[i] != text[k]:
            k = border[k - 1]
        if text[i] == text[k]:
            k += 1
        border[i] = k
    return len(text) - (border[-1] if text else 0)


def _parse_trusted_keys(raw: Any, problems: list[str]) -> tuple[str, ...]:
    """``TRUSTED_AUDIT_KEYS``: base64 raw Ed25519 public keys (32 bytes each)."""
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        problems.append(
            "DURABLE_AGENTS['TRUSTED_AUDIT_KEYS'] must be a list of Ed25519 public keys "
            "(raw 32 bytes, base64), like the 'public_key' of an exported run"
        )
        return ()
    keys: list[str] = []
    for key in raw:
        try:
            ok = isinstance(key, str) and len(base64.b64decode(key, validate=True)) == 32
        except (ValueError, TypeError):
            ok = False
        if not ok:
            problems.append(
                f"DURABLE_AGENTS['TRUSTED_AUDIT_KEYS'] holds {key!r}, which is not an Ed25519 "
                "public key (raw 32 bytes, base64)"
            )
            continue
        keys.append(key)
    return tuple(keys)


def _parse_notify(raw: Any, problems: list[str]) -> Notify:
    where = "DURABLE_AGENTS['NOTIFY']"
    if raw is None:
        return Notify()
    if not isinstance(raw, dict):
        problems.append(
            f"{where} must be a dict, e.g. {{'BASE_URL': 'https://ops.example.com', "
            "'CHANNELS': [{'kind': 'email'}]}"
        )
        return Notify()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _NOTIFY_KEYS:
            problems.append(f"unknown key {where}[{key!r}]{_suggest(str(key), _NOTIFY_KEYS)}")
            continue
        values[_NOTIFY_KEYS[key]] = value
    if not isinstance(values.get("approvals", False), bool):
        problems.append(f"{where}['APPROVALS'] must be True or False")
        values.pop("approvals")
    sender = values.get("from_email")
    if sender is not None and (not isinstance(sender, str) or "@" not in sender):
        problems.append(
            f"{where}['FROM_EMAIL'] must be an email address (or None for "
            f"DEFAULT_FROM_EMAIL), not {sender!r}"
        )
        values.pop("from_email")
    for key in ("interval", "base_delay", "max_delay", "window"):
        if key in values:
            values[key] = _positive(f"NOTIFY.{key.upper()}", values[key], problems)
    for key, top in (("max_attempts", 100), ("batch", 10_000)):
        number = values.get(key, 1)
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= top:
            problems.append(
                f"{where}[{key.upper()!r}] must be an int from 1 to {top}, not {number!r}"
            )
            values.pop(key)
    if values.get("base_delay", 0) > values.get("max_delay", Notify.max_delay):
        problems.append(f"{where}['BASE_DELAY'] must not be longer than 'MAX_DELAY'")

    channels = _parse_channels(values.pop("channels", None), f"{where}['CHANNELS']", problems)
    if values.get("approvals") and channels:
        problems.append(
            f"{where} has both 'APPROVALS' and 'CHANNELS': APPROVALS is the shorthand for "
            "CHANNELS [{'kind': 'email', 'events': ['approval_requested']}]; list the email "
            "channel in CHANNELS and drop APPROVALS"
        )
    elif values.get("approvals"):
        channels = (ChannelConfig("email", "email", (events.APPROVAL_REQUESTED,)),)
    values["channels"] = channels

    base = values.get("base_url", "")
    absolute = isinstance(base, str) and base.startswith(("http://", "https://"))
    if base != "" and not (absolute and len(base) > len("https://") and " " not in base):
        problems.append(
            f"{where}['BASE_URL'] must be the site's absolute address, like "
            f"'https://ops.example.com', not {base!r}"
        )
        values.pop("base_url")
    elif channels and not base:
        what = "'APPROVALS'" if values.get("approvals") else "'CHANNELS'"
        problems.append(
            f"{where}[{what}] needs 'BASE_URL' (the site's absolute address, like "
            "'https://ops.example.com'): every notification links to the call's page"
        )
    notify = Notify(**values)
    return replace(notify, base_url=notify.base_url.rstrip("/"))


def _parse_channels(raw: Any, where: str, problems: list[str]) -> tuple[ChannelConfig, ...]:
    """``NOTIFY["CHANNELS"]``: a list of ``{"kind": ..., ...}``, each checked here but for
    the importability of a dotted ``kind`` (the system check imports it: settings.py may
    build the beat schedule before the site's modules can be imported)."""
    if raw is None:
        return ()
    example = (
        "[{'kind': 'email'}, {'kind': 'webhook', 'url': 'https://hooks.example.com/approvals', "
        "'secret_setting': 'OPS_HOOK_SECRET'}]"
    )
    if not isinstance(raw, list | tuple):
        problems.append(f"{where} must be a list of channels, like {example}")
        return ()
    channels: list[ChannelConfig] = []
    for i, entry in enumerate(raw):
        channel = _parse_channel(entry, f"{where}[{i}]", example, problems)
        if channel is None:
            continue
        if any(c.name == channel.name for c in channels):
            problems.append(
                f"{where}[{i}] is named {channel.name!r} like an earlier channel: give each "
                "channel of a kind after the first a distinct 'name' (a notification row "
                "names its channel)"
            )
            continue
        channels.append(channel)
    return tuple(channels)


def _parse_channel(
    entry: Any, where: str, example: str, problems: list[str]
) -> ChannelConfig | None:
    if not isinstance(entry, dict):
        problems.append(f"{where} must be a dict, like {example}")
        return None
    kind = entry.get("kind")
    if not isinstance(kind, str) or not (kind in CHANNEL_KINDS or _DOTTED.fullmatch(kind)):
        problems.append(
            f"{where}['kind'] must be 'email', 'webhook' or the dotted path of a channel of "
            f"your own ('myapp.notify.PagerChannel'), not {kind!r}"
            f"{_suggest(kind, CHANNEL_KINDS) if isinstance(kind, str) else ''}"
        )
        return None
    bad = len(problems)
    known = _CHANNEL_KEYS.get(kind)
    if known is not None:
        for key in entry:
            if key not in known:
                problems.append(f"unknown key {where}[{key!r}]{_suggest(str(key), known)}")
    name = entry.get("name", kind)
    if not isinstance(name, str) or not _CHANNEL_NAME.fullmatch(name):
        problems.append(f"{where}['name'] must be 1-64 characters of A-Za-z0-9_.:-, not {name!r}")
    chosen = entry.get("events", NOTIFY_EVENTS)
    if (
        isinstance(chosen, str)
        or not isinstance(chosen, list | tuple)
        or not chosen
        or not all(isinstance(e, str) for e in chosen)
    ):
        problems.append(
            f"{where}['events'] must be a non-empty list of {', '.join(NOTIFY_EVENTS)}, "
            f"not {chosen!r}"
        )
        chosen = ()
    for event in chosen:
        if event not in NOTIFY_EVENTS:
            problems.append(
                f"{where}['events'] holds {event!r}, which is not one of "
                f"{', '.join(NOTIFY_EVENTS)}{_suggest(event, NOTIFY_EVENTS)}"
            )
    text = entry.get("text", False)
    if not isinstance(text, bool):
        problems.append(f"{where}['text'] must be True or False, not {text!r}")
    url, secret_setting, timeout = "", "", 10.0
    if kind == "webhook":
        url = entry.get("url", "")
        if (
            not isinstance(url, str)
            or not url.startswith(("http://", "https://"))
            or len(url) <= len("https://")
            or any(c.isspace() for c in url)
        ):
            problems.append(
                f"{where} needs 'url', the receiver's absolute address "
                f"('https://hooks.example.com/approvals'), not {url!r}"
            )
        secret_setting = entry.get("secret_setting", "")
        if not isinstance(secret_setting, str) or not _SETTING_NAME.fullmatch(secret_setting):
            problems.append(
                f"{where} needs 'secret_setting', the name of the Django setting holding the "
                "secret the receiver verifies signatures with (like 'OPS_HOOK_SECRET', read "
                f"from the environment), not {secret_setting!r}"
            )
        timeout = entry.get("timeout", 10.0)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= 120
        ):
            problems.append(
                f"{where}['timeout'] must be a number of seconds from 0 to 120, not {timeout!r}"
            )
            timeout = 10.0
    if len(problems) > bad:
        return None
    options = (
        {}
        if known is not None
        else {k: v for k, v in entry.items() if k not in ("kind", "name", "events", "text")}
    )
    return ChannelConfig(
        name=name,
        kind=kind,
        events=tuple(dict.fromkeys(chosen)),
        text=text,
        url=url,
        secret_setting=secret_setting,
        timeout=float(timeout),
        options=options,
    )


def _parse_retention(raw: Any, problems: list[str]) -> Retention | None:
    where = "DURABLE_AGENTS['RETENTION']"
    example = (
        "{'FINISHED_FOR': 90, 'BY': 'retention-bot', 'EXPORT_DIR': '/var/lib/runs-archive'} "
        "(days; a user holding delete_run; a folder, or None to keep no export)"
    )
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a dict, like {example}")
        return None
    values: dict[str, Any] = {}
    bad = len(problems)
    for key, value in raw.items():
        if key not in _RETENTION_KEYS:
            problems.append(f"unknown key {where}[{key!r}]{_suggest(str(key), _RETENTION_KEYS)}")
            continue
        values[_RETENTION_KEYS[key]] = value
    for key in ("FINISHED_FOR", "BY", "EXPORT_DIR"):
        if _RETENTION_KEYS[key] not in values:
            problems.append(f"{where} needs {key!r}, like {example}")
    days = values.get("finished_for")
    if "finished_for" in values and (
        isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days < 100_000
    ):
        problems.append(f"{where}['FINISHED_FOR'] must be a number of days > 0, not {days!r}")
    by = values.get("by")
    if "by" in values and (not isinstance(by, str) or not by):
        problems.append(f"{where}['BY'] must be the username the prune acts as, not {by!r}")
    folder = values.get("export_dir")
    if folder is not None and not (isinstance(folder, str) and folder.startswith("/")):
        problems.append(
            f"{where}['EXPORT_DIR'] must be an absolute path (or None, said explicitly, to "
            f"keep no export), not {folder!r}"
        )
    batch = values.get("batch", 500)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        problems.append(f"{where}['BATCH'] must be an int from 1 to 10000, not {batch!r}")
    if "every" in values:
        values["every"] = _positive("RETENTION.EVERY", values["every"], problems)
    if len(problems) > bad:
        return None
    return Retention(
        finished_for=float(values["finished_for"]),
        by=values["by"],
        export_dir=folder,
        batch=batch,
        every=values.get("every", 3600.0),
    )


# The last valid settings parsed, with a deep copy of the raw value they came from: a drive
# asks several times per run, and parsing costs more than comparing.
_parsed: tuple[Any, Any, Settings] | None = None


def get_settings() -> Settings:
    """The current settings; ``ConfigError`` naming every problem if they are invalid."""
    from django.conf import settings as django_settings

    global _parsed
    raw = getattr(django_settings, "DURABLE_AGENTS", None)
    cached = _parsed
    # The same object, unchanged even inside (a test may edit the dict in place).
    if cached is not None and cached[0] is raw and cached[1] == raw:
        return cached[2]
    settings, problems = parse(raw)
    if problems:
        raise ConfigError(
            "invalid DURABLE_AGENTS setting: " + "; ".join(problems), code="config.settings"
        )
    try:
        _parsed = (raw, copy.deepcopy(raw), settings)
    except Exception:  # a value that cannot be copied: parse each time
        _parsed = None
    return settings


def _parse_mcp_timeouts(raw: Any, problems: list[str]) -> McpTimeouts:
    """``MCP_TIMEOUTS``: {"CONNECT": s, "LIST": s, "CALL": s, "TASK": s}, each a positive
    number."""
    if raw is None:
        return McpTimeouts()
    if not isinstance(raw, dict):
        problems.append("DURABLE_AGENTS['MCP_TIMEOUTS'] must be a dict")
        return McpTimeouts()
    found: dict[str, float] = {}
    for key, value in raw.items():
        if key not in _MCP_TIMEOUT_KEYS:
            problems.append(
                f"unknown key DURABLE_AGENTS['MCP_TIMEOUTS'][{key!r}]"
                f"{_suggest(str(key), _MCP_TIMEOUT_KEYS)}"
            )
            continue
        found[_MCP_TIMEOUT_KEYS[key]] = _positive(f"MCP_TIMEOUTS.{key}", value, problems)
    return McpTimeouts(**found)
