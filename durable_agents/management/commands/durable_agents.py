"""``manage.py durable_agents <command>``: operate durable runs from a shell or cron."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Operate durable agent runs: runs, recover."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("runs", help="list unfinished runs and why each one waits")
        sub.add_parser("recover", help="one recovery pass: re-enqueue runs nobody drives")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "runs":
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
