"""``manage.py durable_agents <command>``: operate durable runs from a shell or cron."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_agents.engine.errors import DurableAgentsError


class Command(BaseCommand):
    help = "Operate durable agent runs: runs, recover, resolve."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("runs", help="list unfinished runs and why each one waits")
        sub.add_parser("recover", help="one recovery pass: re-enqueue runs nobody drives")
        resolve = sub.add_parser(
            "resolve", help="record what really happened to a halted call, and continue the run"
        )
        resolve.add_argument("run_id")
        resolve.add_argument("call_id")
        resolve.add_argument("--result", required=True, help="the call's outcome, as JSON")
        resolve.add_argument("--error", action="store_true", help="the outcome is a failure")
        resolve.add_argument("--evidence", help="what you checked, as JSON")
        resolve.add_argument("--by", required=True, help="who verified it")
        resolve.add_argument("--min-age", type=float, help="refuse halts younger than this (s)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "resolve":
            self._resolve(options)
        elif options["action"] == "runs":
            self._runs()
        elif options["action"] == "recover":
            from durable_agents.recovery import recover

            sent = recover()
            self.stdout.write(f"re-enqueued {len(sent)} run(s)")
            for run_id in sent:
                self.stdout.write(f"  {run_id}")

    def _runs(self) -> None:
        from durable_agents.engine.commands import pending

        runs = pending()
        if not runs:
            self.stdout.write("no unfinished runs")
            return
        for run in runs:
            tries = f", {run.attempts} failed attempt(s)" if run.attempts else ""
            self.stdout.write(f"{run.run_id}  [{run.agent}] {run.status}: {run.why}{tries}")

    def _resolve(self, options: dict[str, Any]) -> None:
        from durable_agents.engine.halts import resolve_halt

        def parse(name: str) -> Any:
            raw = options.get(name)
            if raw is None:
                return None
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise CommandError(f"--{name} is not valid JSON: {exc}") from None

        try:
            record = resolve_halt(
                options["run_id"],
                options["call_id"],
                parse("result"),
                is_error=options["error"],
                evidence=parse("evidence"),
                by=options["by"],
                min_age=options.get("min_age"),
            )
        except DurableAgentsError as exc:
            raise CommandError(f"{exc.code}: {exc}") from None
        self.stdout.write(
            f"recorded the outcome of {options['call_id']} in {options['run_id']}: "
            f"{json.dumps(record.get('result'))}; the run is handed to a driver"
        )
