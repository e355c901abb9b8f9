"""``python manage.py trip``: a saga, told. The trip agent books a flight and a hotel and
charges the card; with ``--fail card`` the card is declined, with ``--fail hotel`` the hotel
is full, and what was done is undone, latest first, each once (``--fail none``: the trip is
booked). Runs inline on the site's database (SQLite by default)."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

import durable_agents as da
from durable_agents.database.store import site_store
from durable_agents.engine.journal import Journal
from example_project import agents
from example_project.trips import trip

ASK = {
    "none": "Book me Lisbon for 3 nights.",
    "hotel": "Book me Lisbon for 3 nights (the hotel is probably full).",
    "card": "Book me Lisbon for 3 nights; my card may be declined.",
}
KINDS = (
    "flight_booked",
    "hotel_booked",
    "card_charged",
    "charge_refunded",
    "hotel_cancelled",
    "flight_cancelled",
)


class Command(BaseCommand):
    help = "Book a trip as a saga: a failing step undoes the bookings before it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fail", choices=sorted(ASK), default="card", help="which step fails (default: card)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        fail = options["fail"]
        run_id = f"trip-{fail}-{uuid.uuid4().hex[:8]}"
        before = {k: len(agents.effects(k)) for k in KINDS}
        self.stdout.write(f"Run {run_id}: {ASK[fail]!r}")
        try:
            result = trip.run(run_id, ASK[fail])
            self.stdout.write(f"finished: {result.answer}")
        except da.SagaAborted as exc:
            undone = ", ".join(self._undo_names(run_id, exc.details.get("undone") or ()))
            self.stdout.write(f"aborted: {exc.details['cause']['message']}")
            self.stdout.write(f"undone, latest first: {undone or 'nothing'}")
        status = site_store().get_run(run_id).status
        self.stdout.write(f"run is {status}")
        done = {k: len(agents.effects(k)) - before[k] for k in KINDS}
        self.stdout.write(
            "side effects (outside the journal): "
            + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in done.items())
        )

    def _undo_names(self, run_id: str, calls: Any) -> list[str]:
        journal = Journal(site_store())
        out = []
        for call in calls:
            rec = journal.get(run_id, f"compensate:{call}")
            out.append(str(rec.get("name")) if rec is not None else str(call))
        return out
