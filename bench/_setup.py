"""Shared set-up for benchmarks: a dedicated PostgreSQL database, migrated, and a raw
psycopg connection to measure against in the same run."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("DA_BENCH_DB", "durable_agents_bench")
PG = {
    "host": os.environ.get("DA_PG_HOST", "127.0.0.1"),
    "port": os.environ.get("DA_PG_PORT", "5432"),
    "user": os.environ.get("DA_PG_USER", "postgres"),
}

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS bench_raw_journal (
    seq bigserial PRIMARY KEY,
    run_id varchar(400) NOT NULL,
    name varchar(500) NOT NULL,
    data text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, name)
)
"""


def setup_django() -> None:
    """Create the bench database if needed, point Django at it and migrate."""
    with psycopg.connect(dbname="postgres", autocommit=True, **PG) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DA_PG_NAME"] = BENCH_DB
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def raw_connection() -> psycopg.Connection:
    conn = psycopg.connect(dbname=BENCH_DB, autocommit=True, **PG)
    conn.execute(RAW_TABLE)
    return conn


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of the per-pair ratios ``numerators[i] / denominators[i]``: each pair was
    measured back to back, so a load spike moves both sides of a pair (and one pair's
    ratio), not the whole figure."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def add_repeat_argument(parser: Any) -> None:
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure N series in a row; the RESULT lines give the median over the series",
    )


def payload(size: int = 1024) -> str:
    """A ~1 KB canonical JSON record, like a model turn."""
    from durable_agents.engine.records import encode

    text = "The order ships Tuesday; refund approved for line 2. " * 40
    return encode({"kind": "tool", "result": {"text": text[: size - 60]}, "is_error": False})
