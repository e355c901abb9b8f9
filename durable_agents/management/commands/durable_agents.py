"""``manage.py durable_agents <command>``: operate durable runs from a shell or cron."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from durable_agents.engine.journal import Journal
from durable_agents.storage import DjangoStore


class Command(BaseCommand):
    help = "Operate durable agent runs: runs, recover, demo."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("runs", help="list unfinished runs and why each one waits")
        sub.add_parser("recover", help="one recovery pass: re-enqueue runs nobody drives")
        demo = sub.add_parser("demo", help="show the journal surviving a crash")
        demo.add_argument("--child", help="internal: drive the demo run in this process")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "runs":
            self._runs()
        elif options["action"] == "recover":
            from durable_agents.recovery import recover

            sent = recover()
            self.stdout.write(f"re-enqueued {len(sent)} run(s)")
            for run_id in sent:
                self.stdout.write(f"  {run_id}")
        elif options["action"] == "demo":
            if options.get("child"):
                _demo_steps(options["child"], crash_after=2, out=self.stdout.write)
            else:
                self._demo()

    def _runs(self) -> None:
        from durable_agents.engine.commands import pending

        runs = pending()
        if not runs:
            self.stdout.write("no unfinished runs")
            return
        for run in runs:
            tries = f", {run.attempts} failed attempt(s)" if run.attempts else ""
            self.stdout.write(f"{run.run_id}  [{run.agent}] {run.status}: {run.why}{tries}")

    def _demo(self) -> None:
        say = self.stdout.write
        call_command("migrate", verbosity=0, interactive=False)
        run_id = f"demo-{int(time.time())}"
        say(f"1. A child process drives run {run_id!r} and is killed (SIGKILL) after step 2.")
        child = subprocess.run(
            [sys.executable, *sys.argv[:1], "durable_agents", "demo", "--child", run_id],
            capture_output=True,
            text=True,
            check=False,
        )
        say(child.stdout.rstrip())
        say(f"   child exited with signal {-child.returncode}")
        journal = Journal(DjangoStore())
        say("2. What the journal holds after the crash:")
        for record in journal.history(run_id):
            say(f"   #{record.seq} {record.name}: {record.body}")
        say("3. A new process resumes: recorded steps are read back, not run again.")
        _demo_steps(run_id, crash_after=None, out=say)
        say("4. The journal now:")
        for record in journal.history(run_id):
            say(f"   #{record.seq} {record.name}")
        say("Each step ran once, whatever the crash.")


def _demo_steps(run_id: str, crash_after: int | None, out: Any) -> None:
    journal = Journal(DjangoStore())
    steps = [
        ("look up order 7", lambda: {"order": 7, "total_cents": 4200}),
        ("charge the card", lambda: {"charge": "ch_1", "amount_cents": 4200}),
        ("email the receipt", lambda: {"email": "sent"}),
    ]
    for index, (name, effect) in enumerate(steps, start=1):
        ran: list[int] = []

        def fn(effect: Any = effect, ran: list[int] = ran) -> dict[str, Any]:
            ran.append(1)
            return {"kind": "step", "value": effect()}

        record = journal.do(run_id, f"step:{name}", fn)
        how = "ran now" if ran else "replayed from the journal"
        out(f"   step {index} {name!r}: {record.get('value')} ({how})")
        if crash_after == index:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
