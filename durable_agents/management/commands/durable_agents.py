"""``manage.py durable_agents <command>``: operate durable runs from a shell or cron.

``runs`` lists what is unfinished, what each run waits on, and the commands that act on it,
quoted to run as pasted (``durable_agents.hints``); ``approve``, ``deny``, ``cancel``,
``resume``, ``resolve``, ``answer``, ``signal``, ``send`` and ``wake`` act as a named user, who
must exist, be active and hold the permission the admin would ask for (the table in
``durable_agents.permissions``; the engine checks it, as on every path); the action log
records the user and the ``command`` channel. ``import`` takes ``--by`` the same way (it
needs ``import_runs``) and keeps runs inert evidence unless ``--live`` (docs/replay.md).
``prune`` exports, then deletes, runs finished before a date, as ``--by`` (who needs
``delete_run``), leaving a tombstone each (``durable_agents.database.retention``,
docs/retention.md). ``notify`` is one pass of the notification outbox, for cron without
Celery beat (docs/notifications.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_agents import hints
from durable_agents.engine.errors import DurableAgentsError
from durable_agents.engine.ports import KIND_AGENT, STATUSES, TERMINAL_STATUSES
from durable_agents.people import actor_for
from durable_agents.permissions import needs

UNFINISHED = [s for s in STATUSES if s not in TERMINAL_STATUSES]

# Django's options that apply to every command. The top-level parser knows them; a
# subcommand's parser does not, so "durable_agents runs --settings=x" would be refused.
# Each subcommand gets them too, with SUPPRESS so the top-level value stands when absent.
_GLOBAL_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
]


# Adds one subcommand's parser (its name, its help) and returns it.
_Command = Callable[[str, str], CommandParser]


def _add_listing(command: _Command) -> None:
    """``runs``, and the passes Celery beat runs: ``recover``, ``notify``."""
    runs = command("runs", "list unfinished runs, why each one waits, and the calls to act on")
    runs.add_argument(
        "--status", action="append", choices=UNFINISHED, help="only runs in this status"
    )
    runs.add_argument("--json", action="store_true", help="one JSON document on stdout")
    runs.add_argument("--limit", type=int, default=1000)
    runs.add_argument(
        "--stalled",
        action="store_true",
        help="only runs queued for several recovery intervals with no driver",
    )
    runs.add_argument(
        "--by",
        help="the username the printed commands act as (default: your login name, "
        "if it names an active user here)",
    )

    command("recover", "one recovery pass: hand runs nobody drives to a driver")
    command(
        "notify",
        "one pass of the notification outbox: write the rows missing for facts, then send "
        "what is due (what Celery beat runs every NOTIFY['INTERVAL'] seconds)",
    )


def _add_deciding(command: _Command) -> None:
    """Deciding a run's fate: ``approve``, ``deny``, ``cancel``, ``resume``."""
    for verb, what in (("approve", "approve"), ("deny", "deny")):
        p = command(verb, f"{what} a gated call, as a user who may decide it")
        p.add_argument("run_id")
        p.add_argument("call_id")
        p.add_argument(
            "--by", required=True, help=f"the username deciding; needs {needs('decide')}"
        )
        p.add_argument("--note", default="", help="why (shown to the model on a denial)")
        p.add_argument(
            "--for",
            dest="for_approver",
            default=None,
            metavar="USER",
            help="decide as USER's deputy (a delegation in force): the decision is "
            "USER's, made by --by",
        )
        if verb == "approve":
            p.add_argument(
                "--edit",
                default=None,
                help="approve with edits: the arguments that run instead, as a JSON "
                "object (checked against the tool's schema)",
            )

    cancel = command("cancel", "cancel an unfinished run; it is never driven again")
    cancel.add_argument("run_id")
    cancel.add_argument(
        "--by", required=True, help=f"the username cancelling; needs {needs('cancel')}"
    )
    cancel.add_argument("--reason", default="")

    resume = command(
        "resume",
        "hand an unfinished run (a failed one too) to a driver again, once what stopped it "
        "is fixed",
    )
    resume.add_argument("run_id")
    resume.add_argument(
        "--by", required=True, help=f"the username resuming; needs {needs('resume')}"
    )


def _add_waking(command: _Command) -> None:
    """What a waiting run waits for: ``answer``, ``signal``, ``send``, ``wake``."""
    answer = command("answer", "answer a question a run asks (an interrupt)")
    answer.add_argument("run_id")
    answer.add_argument("name", help="the interrupt's name")
    answer.add_argument(
        "--value", required=True, help="the answer, as JSON (checked against its schema)"
    )
    answer.add_argument(
        "--by", required=True, help=f"the username answering; needs {needs('answer')}"
    )

    sig = command("signal", "deliver a signal a run waits for (the first payload wins)")
    sig.add_argument("run_id")
    sig.add_argument("name", help="the signal's name")
    sig.add_argument("--payload", default="null", help="the payload, as JSON")
    sig.add_argument(
        "--by", required=True, help=f"the username sending it; needs {needs('signal')}"
    )

    send = command("send", "put a message on a run's channel (deduplicated by key)")
    send.add_argument("run_id")
    send.add_argument("channel")
    send.add_argument("key", help="the message's key: a second message with it is ignored")
    send.add_argument("--payload", default="null", help="the message, as JSON")
    send.add_argument(
        "--by", required=True, help=f"the username sending it; needs {needs('enqueue')}"
    )

    wake = command("wake", "wake a sleeping run's timer now, before its time")
    wake.add_argument("run_id")
    wake.add_argument("name", help="the timer's name")
    wake.add_argument("--by", required=True, help=f"the username waking it; needs {needs('wake')}")


def _add_repairing(command: _Command) -> None:
    """Settling a halted call, and a session's channel: ``resolve``, ``session-channel``."""
    resolve = command(
        "resolve", "record what really happened to a halted call, and continue the run"
    )
    resolve.add_argument("run_id")
    resolve.add_argument("call_id")
    resolve.add_argument("--result", required=True, help="the call's outcome, as JSON")
    resolve.add_argument("--error", action="store_true", help="the outcome is a failure")
    resolve.add_argument("--evidence", help="what you checked, as JSON")
    resolve.add_argument(
        "--by", required=True, help=f"the username who verified it; needs {needs('resolve')}"
    )
    resolve.add_argument("--min-age", type=float, help="refuse halts younger than this (s)")

    owner = command(
        "session-channel",
        "give a session to another channel from now on: the webhook view, the API or "
        "the site's code its messages may come from (docs/sessions.md)",
    )
    owner.add_argument("session_id")
    owner.add_argument("channel", help="e.g. webhook:SENDER_A_SECRET, api, site")
    owner.add_argument(
        "--by", required=True, help=f"the username giving it; needs {needs('cancel')}"
    )


def _add_moving(command: _Command) -> None:
    """Runs in and out of the site: ``export``, ``import``, ``prune``."""
    export = command("export", "write a run as JSON lines on stdout (docs/replay.md)")
    export.add_argument("run_id")
    export.add_argument("--with-forks", action="store_true", help="its forks too, and theirs")
    imp = command(
        "import",
        "import runs from an export file, as inert evidence unless --live; refuses run "
        "ids the site already has (docs/replay.md, 'Imports')",
    )
    imp.add_argument("file", help="the export file, or - for stdin")
    imp.add_argument("--by", required=True, help=f"the username importing; needs {needs('import')}")
    imp.add_argument(
        "--live",
        action="store_true",
        help="import runs this site may drive and decide: every decision in the file "
        "must carry a signature by an approver key registered here, or nothing is imported",
    )
    prune = command(
        "prune",
        "export, then delete, runs finished before a date, leaving a signed tombstone "
        "each (docs/retention.md)",
    )
    prune.add_argument(
        "--finished-before",
        required=True,
        metavar="DATE",
        help="prune runs finished before this: YYYY-MM-DD or an ISO 8601 time (UTC when "
        "it names no zone); never in the future",
    )
    prune.add_argument(
        "--export",
        metavar="DIR",
        help="write each batch's export file here (fsynced) before deleting it; without "
        "it, nothing but the tombstones keeps what was deleted",
    )
    prune.add_argument("--by", required=True, help=f"the username pruning; needs {needs('delete')}")
    prune.add_argument("--batch", type=int, default=500, help="trees per transaction")
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would go and what stays; delete nothing",
    )


def _add_checking(command: _Command) -> None:
    """Checking the record: ``verify``, ``bundle``, ``replay``."""
    verify = command(
        "verify",
        "recompute the audit hash chains (docs/audit.md) and report the first broken record "
        "of each run; exit status 1 if any is broken",
    )
    verify.add_argument("run_ids", nargs="*", metavar="RUN")
    verify.add_argument("--all", action="store_true", help="every run, and the site's action log")
    verify.add_argument("--json", action="store_true", help="one JSON document on stdout")
    bundle = command(
        "bundle",
        "write one run's audit bundle (journal, signed head, decisions, action log) as JSON "
        "on stdout; docs/audit.md has a script that checks it without Django",
    )
    bundle.add_argument("run_id")
    replay = command(
        "replay",
        "re-drive recorded runs against today's agent code, calling no model and no tool "
        "(docs/replay.md); exit status 1 if any diverges",
    )
    replay.add_argument("run_ids", nargs="+", metavar="RUN")
    replay.add_argument(
        "--agent", help="replay against this registered agent (default: the run's own)"
    )
    replay.add_argument("--json", action="store_true", help="one JSON document on stdout")


class Command(BaseCommand):
    help = (
        "Operate durable agent runs: runs, approve, deny, cancel, resume, resolve, answer, "
        "signal, send, wake, recover, notify, session-channel, export, import, prune."
    )
    # ``import -`` reads this stream (call_command(..., stdin=...)), else the process's stdin.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=CommandParser)

        def command(name: str, help: str) -> CommandParser:
            p: CommandParser = sub.add_parser(name, help=help, description=help)
            for flags, kwargs in _GLOBAL_OPTIONS:
                p.add_argument(*flags, default=argparse.SUPPRESS, **kwargs)
            return p

        # In this order: ``--help`` lists the subcommands as they were added.
        for add in (
            _add_listing,
            _add_deciding,
            _add_waking,
            _add_repairing,
            _add_moving,
            _add_checking,
        ):
            add(command)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        for name, value in options.items():
            if isinstance(value, str) and value in hints.PLACEHOLDERS:
                raise CommandError(
                    f"{value} ({name}) is a placeholder the printed command left for you: "
                    "replace it with the real value"
                )
        try:
            getattr(self, f"_{action.replace('-', '_')}")(options)
        except DurableAgentsError as exc:
            raise CommandError(f"{exc.code}: {exc}") from None

    # -- reading ------------------------------------------------------------------------

    def _runs(self, options: dict[str, Any]) -> None:
        from durable_agents.celery.queue_health import stalled_runs
        from durable_agents.engine.commands.runs import pending

        if options.get("by") is not None:
            actor_for(options["by"])  # a --by that names nobody fails before anything prints
        health = stalled_runs(limit=options["limit"])
        statuses = ["queued"] if options["stalled"] else options["status"]
        runs = pending(limit=options["limit"], statuses=statuses)
        if options["stalled"]:
            stalled = {run_id for run_id, _ in health.oldest}
            runs = [r for r in runs if r.run_id in stalled]
        if health:  # on stderr, so --json stays one document
            self.stderr.write(f"warning: {health.message()}")
        if options["json"]:
            self.stdout.write(json.dumps([r.to_json() for r in runs], indent=2))
            return
        if not runs:
            self.stdout.write("no stalled runs" if options["stalled"] else "no unfinished runs")
            return
        by = options.get("by") or hints.YOU
        commands = 0
        for run in runs:
            tries = f", {run.attempts} failed attempt(s)" if run.attempts else ""
            self.stdout.write(f"{run.run_id}  [{run.agent}] {run.status}: {run.why}{tries}")
            for line in hints.run_lines(run, by):
                commands += hints.CLI in line
                self.stdout.write(f"    {line}")
        if commands and options.get("by") is None:
            self.stderr.write(
                f"note: replace {hints.YOU} in the commands above with your username, or run "
                "`python manage.py durable_agents runs --by USERNAME` to print them for you"
            )

    def _recover(self, options: dict[str, Any]) -> None:
        from durable_agents.celery.recovery import recover

        sent = recover()
        self.stdout.write(f"re-enqueued {len(sent)} run(s)")
        for run_id in sent:
            self.stdout.write(f"  {run_id}")

    def _notify(self, options: dict[str, Any]) -> None:
        from durable_agents.notifications import deliver

        done = deliver()
        self.stdout.write(
            f"sent {done.sent}, to try again {done.retrying}, given up {done.failed}; "
            f"{done.reconciled} missing row(s) written"
        )

    def _export(self, options: dict[str, Any]) -> None:
        from durable_agents.transfer import export_lines

        lines = export_lines(options["run_id"], with_forks=options["with_forks"])
        first = next(lines)  # a missing run fails here, before anything is written
        self.stdout.write(first)
        for text in lines:
            self.stdout.write(text)

    def _import(self, options: dict[str, Any]) -> None:
        from durable_agents.transfer import import_bytes, import_lines

        name = options["file"]
        by = actor_for(options["by"])
        live = options["live"]
        try:
            if name == "-":
                stream = options.get("stdin") or sys.stdin
                raw = getattr(stream, "buffer", None)
                if raw is not None:  # the process's stdin: its bytes, for their digest
                    run_ids = import_bytes(raw.read(), by=by, live=live)
                else:
                    run_ids = import_lines(stream, by=by, live=live)
            else:
                with open(name, "rb") as f:
                    data = f.read()
                run_ids = import_bytes(data, by=by, live=live)
        except OSError as exc:
            raise CommandError(f"cannot read {name}: {exc}") from None
        how = "live" if live else "as inert evidence (never driven nor decided here)"
        self.stdout.write(f"imported {len(run_ids)} run(s) {how}")
        for run_id in run_ids:
            self.stdout.write(f"  {run_id}")

    def _prune(self, options: dict[str, Any]) -> None:
        from durable_agents.database.retention import prune

        cutoff = _cutoff(options["finished_before"])
        by = actor_for(options["by"])
        report = prune(
            finished_before=cutoff,
            by=by,
            export_dir=options.get("export"),
            batch=options["batch"],
            dry_run=options["dry_run"],
        )
        verb = "would prune" if report.dry_run else "pruned"
        self.stdout.write(
            f"{verb} {len(report.pruned)} run(s) finished before {cutoff.isoformat()}"
        )
        if report.dry_run or options.get("verbosity", 1) > 1:
            for run_id in report.pruned:
                self.stdout.write(f"  {run_id}")
        for f in report.files:
            self.stdout.write(f"  export {f['file']} sha256 {f['sha256']} ({f['runs']} run(s))")
        if report.kept:
            self.stdout.write(f"kept {len(report.kept)} finished tree(s):")
            for root, why in sorted(report.kept.items()):
                self.stdout.write(f"  {root}: {why}")
        if not options.get("export") and not report.dry_run and report.pruned:
            self.stderr.write("note: no --export: only the tombstones say what was deleted")

    def _verify(self, options: dict[str, Any]) -> None:
        from durable_agents.database.audit import verify

        if bool(options["run_ids"]) == bool(options["all"]):
            raise CommandError("name the runs to verify, or --all (not both)")
        reports = verify(options["run_ids"] or None, actions=options["all"])
        if options["json"]:
            self.stdout.write(json.dumps([r.to_json() for r in reports], indent=2))
        else:
            for report in reports:
                self.stdout.write(report.message())
        broken = [r for r in reports if not r.intact]
        unverified = [r for r in reports if r.intact and not r.ok]
        if broken or unverified:
            said = [f"{len(broken)} of {len(reports)} chain(s) broken"] if broken else []
            if unverified:
                said.append(
                    f"{len(unverified)} of {len(reports)} chain(s) unverified (no signature by "
                    "a key this site trusts vouches for them: an imported head, or a tombstone)"
                )
            raise CommandError("; ".join(said), returncode=1)

    def _bundle(self, options: dict[str, Any]) -> None:
        from durable_agents.database.audit import bundle

        found = bundle(options["run_id"])
        imported = found.get("imported")
        if imported and not imported["trusted"]:  # on stderr: stdout stays one document
            self.stderr.write(
                f"warning: run {options['run_id']} was imported and no head signed by a "
                f"trusted key vouches for its chain ({imported['why']}); this site does not "
                "sign its head"
            )
        self.stdout.write(json.dumps(found, indent=1, ensure_ascii=False))

    def _replay(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.registry import get_agent
        from durable_agents.engine.replay import replay

        agent = get_agent(options["agent"]) if options["agent"] else None
        reports = [replay(run_id, agent) for run_id in options["run_ids"]]
        if options["json"]:
            self.stdout.write(json.dumps([r.to_json() for r in reports], indent=2))
        else:
            for report in reports:
                self.stdout.write(report.describe())
        diverged = [r for r in reports if not r.identical]
        if diverged:
            raise CommandError(
                f"{len(diverged)} of {len(reports)} run(s) diverge from today's code",
                returncode=1,
            )

    # -- acting -------------------------------------------------------------------------

    def _approve(self, options: dict[str, Any], approved: bool = True) -> None:
        from durable_agents.engine.commands.approvals import approve

        edit = None
        if options.get("edit") is not None:
            try:
                edit = json.loads(options["edit"])
            except ValueError as exc:
                raise CommandError(f"--edit is not valid JSON: {exc}") from None
        outcome = approve(
            options["run_id"],
            options["call_id"],
            approved,
            by=actor_for(options["by"]),
            note=options["note"],
            edit=edit,
            for_approver=options.get("for_approver"),
        )
        self.stdout.write(
            f"call {options['call_id']} of run {options['run_id']}: {outcome.status}"
            + (" (the run is handed to a driver)" if outcome.status != "pending" else "")
        )

    def _deny(self, options: dict[str, Any]) -> None:
        self._approve(options, approved=False)

    def _cancel(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.runs import cancel

        cancel(
            options["run_id"],
            by=actor_for(options["by"]),
            reason=options["reason"],
        )
        self.stdout.write(f"run {options['run_id']} is cancelled")

    def _session_channel(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.sessions import give_session

        before = give_session(
            options["session_id"], options["channel"], by=actor_for(options["by"])
        )
        self.stdout.write(
            f"session {options['session_id']} belongs to {options['channel']} (was {before})"
        )

    def _resume(self, options: dict[str, Any]) -> None:
        from durable_agents.engine import identity
        from durable_agents.engine.commands.runs import get_run, hand_over
        from durable_agents.engine.registry import get_agent
        from durable_agents.permissions import RULES

        actor = actor_for(options["by"])
        identity.require(actor, identity.OPERATE_RUNS, RULES["resume"].what)
        run = get_run(options["run_id"])
        if run.kind != KIND_AGENT:
            raise CommandError(
                f"run {run.run_id!r} is a {run.kind} journal, not an agent run: nothing drives "
                "it (a halted journal step is resolved with the resolve command)"
            )
        if run.status not in TERMINAL_STATUSES:
            try:
                get_agent(run.agent)  # a driver could not continue it: say so, hand nothing over
            except DurableAgentsError as exc:
                raise CommandError(
                    f"run {run.run_id!r} belongs to agent {run.agent!r}, which this site cannot "
                    f"load ({exc.code}: {exc}); fix DURABLE_AGENTS['AGENTS'] (python manage.py "
                    "check says what is wrong), restart the workers, then resume it"
                ) from None
        hand_over(run.run_id, by=actor, via="command")
        self.stdout.write(f"run {run.run_id} ({run.status}) is handed to a driver")

    def _answer(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.waits import answer_interrupt

        value = _json_option(options, "value")
        outcome = answer_interrupt(
            options["run_id"], options["name"], value, by=actor_for(options["by"])
        )
        said = "recorded" if outcome.recorded else "already recorded"
        self.stdout.write(
            f"answer to {options['name']} of run {options['run_id']}: {said}"
            + ("; the run is handed to a driver" if outcome.woke else "")
        )

    def _signal(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.waits import signal

        payload = _json_option(options, "payload")
        outcome = signal(options["run_id"], options["name"], payload, by=actor_for(options["by"]))
        said = "delivered" if outcome.recorded else "already delivered (the first payload stands)"
        self.stdout.write(
            f"signal {options['name']} to run {options['run_id']}: {said}"
            + ("; the run is handed to a driver" if outcome.woke else "")
        )

    def _send(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.waits import enqueue

        payload = _json_option(options, "payload")
        outcome = enqueue(
            options["run_id"],
            options["channel"],
            options["key"],
            payload,
            by=actor_for(options["by"]),
        )
        said = "sent" if outcome.recorded else "already sent (the first payload stands)"
        self.stdout.write(
            f"message {options['key']} on {options['channel']} of run {options['run_id']}: "
            f"{said}" + ("; the run is handed to a driver" if outcome.woke else "")
        )

    def _wake(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.timers import wake_timer

        outcome = wake_timer(options["run_id"], options["name"], by=actor_for(options["by"]))
        said = "woken" if outcome.recorded else "already awake"
        self.stdout.write(
            f"timer {options['name']} of run {options['run_id']}: {said}"
            + ("; the run is handed to a driver" if outcome.woke else "")
        )

    def _resolve(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.commands.halts import resolve_halt

        def parse(name: str) -> Any:
            raw = options.get(name)
            if raw is None:
                return None
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise CommandError(f"--{name} is not valid JSON: {exc}") from None

        result, evidence = parse("result"), parse("evidence")
        record = resolve_halt(
            options["run_id"],
            options["call_id"],
            result,
            is_error=options["error"],
            evidence=evidence,
            by=actor_for(options["by"]),
            min_age=options.get("min_age"),
        )
        self.stdout.write(
            f"recorded the outcome of {options['call_id']} in {options['run_id']}: "
            f"{json.dumps(record.get('result'))}; the run is handed to a driver"
        )


def _cutoff(text: str) -> datetime:
    """``--finished-before``: a date (midnight UTC) or an ISO 8601 time."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--finished-before {text!r} is not a date: give YYYY-MM-DD or an ISO 8601 time "
            "like 2026-01-31T00:00:00+00:00"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _json_option(options: dict[str, Any], name: str) -> Any:
    try:
        return json.loads(options[name])
    except ValueError as exc:
        raise CommandError(f"--{name} is not valid JSON: {exc}") from None
