"""The example site's trip-booking saga (``manage.py trip``), run as a user runs it: on the
embedded default (SQLite, inline dispatch), in a subprocess. A declined card undoes the hotel,
then the flight; a full hotel undoes the flight; each once, counted in the demo's ledger,
outside the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(120)


def trip(demo_dir: Path, fail: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DA_", "DATABASE_URL"))}
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        DURABLE_AGENTS_DEMO_DIR=str(demo_dir),
        DJANGO_DEBUG="true",
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "trip", "--fail", fail],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def ledger(demo_dir: Path) -> Counter[str]:
    lines = (demo_dir / "effects.jsonl").read_text().splitlines()
    return Counter(json.loads(line)["kind"] for line in lines if line.strip())


def test_a_declined_card_undoes_the_hotel_then_the_flight(tmp_path):
    text = trip(tmp_path, "card")
    assert "aborted: the card was declined" in text
    assert "undone, latest first: book_hotel, book_flight" in text
    assert "run is compensated" in text
    assert ledger(tmp_path) == {
        "flight_booked": 1,
        "hotel_booked": 1,
        "hotel_cancelled": 1,
        "flight_cancelled": 1,
    }


def test_a_full_hotel_undoes_the_flight_and_a_good_trip_is_booked(tmp_path):
    text = trip(tmp_path, "hotel")
    assert "aborted: Full House has no rooms left" in text
    assert "undone, latest first: book_flight" in text
    assert ledger(tmp_path) == {"flight_booked": 1, "flight_cancelled": 1}
    text = trip(tmp_path, "none")
    assert "finished: Your trip to Lisbon is booked" in text and "run is finished" in text
    assert ledger(tmp_path) == {
        "flight_booked": 2,
        "flight_cancelled": 1,
        "hotel_booked": 1,
        "card_charged": 1,
    }
