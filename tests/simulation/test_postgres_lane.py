"""The simulator's PostgreSQL lane (``pg_lane.py``): the same actors and invariants over
``DjangoStore`` on the test database, a session per simulated process, the virtual clock
inside the server.

``SIM_PG_SEEDS=0-999`` runs more seeds (default: ``DEFAULT_PG_SEEDS``, sized for CI), and
``SIM_PG_MIRROR_SEEDS`` more seeds on both lanes with instant takeover off;
``SIM_SEED=1234 ... tests/simulation/test_postgres_lane.py -k replay -s`` replays one and
prints its trace (``SIM_STORE=postgres-expiry``: with instant takeover off). How the lane
works: ``pg_lane.py``.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace
from typing import Any

import pytest
from django.db import connections

from durable_agents.engine.ports import HaltInfo, RunInfo
from durable_agents.models import Follower

from . import coverage as cover
from . import pg_lane
from .actors import Driver
from .directed import run
from .runner import (
    config_for,
    digest,
    fail_if_broken,
    parse_seeds,
    replay_command,
    run_seeds,
    summarize,
)
from .scenario import simulate
from .world import EPOCH, Config, World, patched

# About 3 s a seed on PostgreSQL on a 2-core machine (0.1 s in memory: the Django store's
# queries are most of it), so CI runs a few dozen seeds, the whole file in about 80 s.
DEFAULT_PG_SEEDS = 18
# Seeds run on both lanes with instant takeover off, whose traces must be the same.
DEFAULT_MIRROR_SEEDS = 6

# The test database (the lane's sessions are its own, and empty the tables at every seed).
pytestmark = pytest.mark.django_db(transaction=True)

SEEDS = parse_seeds(os.environ.get("SIM_PG_SEEDS"), default=DEFAULT_PG_SEEDS)
MIRROR_SEEDS = parse_seeds(os.environ.get("SIM_PG_MIRROR_SEEDS"), default=DEFAULT_MIRROR_SEEDS)


def _budget(seeds: range) -> int:
    """The test's timeout: the suite's, or ten seconds a seed for a longer run."""
    return max(300, 10 * len(seeds))


@pytest.fixture(scope="module")
def _lane_schema(django_db_setup, django_db_blocker):
    """Schema ``sim`` for this module; dropped, and the scheduler's connection closed, before
    pytest-django drops the test database."""
    with django_db_blocker.unblock():
        try:
            pg_lane.database().install()
            yield
        finally:
            pg_lane.shutdown()


@pytest.fixture
def lane(_lane_schema, django_db_blocker):
    with django_db_blocker.unblock():
        yield pg_lane.database()


def pg_config(seed: int, store: str | None = None) -> Config:
    return replace(config_for(seed), store=store or os.environ.get("SIM_STORE") or "postgres")


@pytest.mark.timeout(_budget(SEEDS))
def test_seeds_keep_the_promise_on_postgres(lane):
    seeds = SEEDS
    # Without the faults aimed by coverage (``coverage.py``), which the memory lane's 1,200
    # seeds measure: a few dozen seeds here must still reach what ``wanted`` names, and the
    # aim's faults (two a seed) would take some of them elsewhere.
    env = dict(os.environ)
    env.setdefault("SIM_FAULTS", "-cover")
    findings, coverage = run_seeds(seeds, env, store="postgres")
    if findings:
        pytest.fail("PostgreSQL lane: " + summarize(findings, len(seeds)), pytrace=False)
    # The lane explores what the memory lane does (crashes, people, limits: slots and rates
    # in SQL), and instant takeover.
    wanted = (
        *("crash at a tool point", "halts resolved", "calls approved", "instant takeovers"),
        "runs throttled",
    )
    for what in wanted:
        assert coverage.get(what), f"no PostgreSQL seed exercised {what!r}: {coverage}"


def pg_fresh_seeds() -> range:
    """``SIM_PG_FRESH`` (a range), or the few seeds after the memory lane's fresh ones of
    this run of the suite (``tests/conftest.py`` draws and prints them)."""
    from tests.conftest import FRESH_SEEDS, PG_FRESH_SEEDS

    if os.environ.get("SIM_PG_FRESH"):
        return parse_seeds(os.environ["SIM_PG_FRESH"])
    base = int(os.environ.get("SIM_FRESH") or 1_000_000) + FRESH_SEEDS
    return range(base, base + PG_FRESH_SEEDS)


FRESH = pg_fresh_seeds()


@pytest.mark.timeout(_budget(FRESH))
def test_fresh_seeds_on_postgres(lane):
    """Seeds nobody ran before, on PostgreSQL, with every fault (the coverage aim too): the
    fixed seeds above only prove the schedules they know. Nothing is required of what they
    reach; they must keep the promise. ``SIM_PG_MINUTES`` bounds a long sweep's time
    (``scripts/sim-sweep``): the seeds not started by then are left for another night."""
    minutes = float(os.environ.get("SIM_PG_MINUTES") or 0)
    until = time.monotonic() + 60 * minutes if minutes else None
    findings, coverage = run_seeds(FRESH, store="postgres", until=until)
    ran = coverage.get("seeds run", 0)
    print(f"\nPostgreSQL lane: fresh seeds {FRESH.start}-{FRESH.start + ran - 1}, {ran} run")
    print(cover.table(coverage, ran))
    if findings:
        pytest.fail(
            f"PostgreSQL lane, fresh seeds from {FRESH.start}: " + summarize(findings, ran),
            pytrace=False,
        )
    assert ran, "no fresh seed ran"


# Fresh seeds that once broke the promise on PostgreSQL, each kept as a fixed case once its
# cause was fixed (in the product, or in the simulator's model of it).
FOUND_SEEDS = (
    # A drive's lease grant committed but answered with an error: the drive ended without
    # knowing it held the lease, its connection closed, and the next drive took the lease
    # at once; the invariant took the ended drive for a live holder.
    294032954,
)


def test_found_seeds_stay_fixed(lane):
    findings = []
    for seed in FOUND_SEEDS:
        world = simulate(pg_config(seed))
        findings += [f"seed {seed}: {v}" for v in world.violations]
    assert not findings, "\n".join(findings)


def test_replay(lane):
    """``SIM_SEED=<n>``: that one schedule on PostgreSQL, its trace printed (a short one
    unless set, so every run of the suite exercises the replay path)."""
    config = pg_config(int(os.environ.get("SIM_SEED", "1")))
    world = simulate(config)
    print("\n".join(world.format_trace()))
    for violation in world.violations:
        print(violation)
    fail_if_broken(world, " on PostgreSQL")


@pytest.mark.timeout(_budget(MIRROR_SEEDS))
def test_seeds_run_the_memory_lanes_schedules(lane):
    """With instant takeover off (leases taken over on expiry only, as in memory), a seed
    runs on PostgreSQL exactly the schedule it runs on ``InMemoryStore``: every store call
    answered alike, so the same trace. A divergence is a call the two stores answer
    differently (or a lane that models something the memory lane does not)."""
    for seed in MIRROR_SEEDS:
        config = pg_config(seed, "postgres-expiry")
        pg, memory = simulate(config), simulate(replace(config, store="memory"))
        fail_if_broken(pg, " on PostgreSQL")
        ours, theirs = pg.format_trace(), memory.format_trace()
        if ours != theirs:
            common = min(len(ours), len(theirs))
            at = next((i for i in range(common) if ours[i] != theirs[i]), common)
            pytest.fail(
                f"seed {seed}: PostgreSQL (instant takeover off) left the memory lane's "
                f"schedule at line {at}:\n"
                + "\n".join(f"  memory    {line}" for line in theirs[max(0, at - 3) : at + 2])
                + "\n"
                + "\n".join(f"  postgres  {line}" for line in ours[max(0, at - 3) : at + 2])
                + f"\nreplay: {replay_command(config)}",
                pytrace=False,
            )


@pytest.mark.parametrize("seed", [35, 40])  # short seeds, with crashes and instant takeovers
def test_one_pg_seed_is_one_schedule(lane, seed):
    """Same seed, same schedule on PostgreSQL too: the virtual clock is the database's, the
    tables start empty (seqs and ids replay), a crashed process's locks are gone before
    anyone moves again."""
    first, second = simulate(pg_config(seed)), simulate(pg_config(seed))
    assert len(first.trace) > 50
    assert digest(first) == digest(second)


def _world() -> World:
    return World(Config(0, faults=frozenset(), store="postgres"))


def test_the_database_clock_is_the_virtual_one(lane):
    """``now()`` in SQL, Django's ``Now()``, the columns' defaults and the migrations'
    triggers all read the virtual clock, in every process's session."""
    w = _world()
    with patched(w):
        try:
            w.advance(7.5)

            def read() -> tuple[float, float]:
                w.store.create_run(RunInfo("r1", agent="a"))
                w.store.save_halt(HaltInfo("r1", "c1", "charge", {}, "attempt:c1"))
                [halt] = w.store.list_halts(run_id="r1")  # created_at: a column default
                return w.store.now().timestamp(), halt.created_at.timestamp()

            proc = run(w, Driver("d1"), "read", read)
            assert proc.result == (EPOCH + 7.5, EPOCH + 7.5)
            row = w.raw.get_run("r1")  # the scheduler's own session
            assert row is not None and row.created_at.timestamp() == EPOCH + 7.5
            w.advance(3.0)
            assert w.raw.now().timestamp() == EPOCH + 10.5

            def notified() -> int:
                # The journal's trigger (plpgsql, a migration's) tells followers whose row has
                # not expired by ``now()``: one that expires 10 virtual seconds from now (long
                # ago by the real clock) is told.
                wrapper = connections[pg_lane.ALIAS]  # this process's session
                wrapper.ensure_connection()
                raw = wrapper.connection
                heard: list[Any] = []
                raw.add_notify_handler(heard.append)
                raw.execute(f"LISTEN da_run_{hashlib.md5(b'r1').hexdigest()}")
                raw.execute(
                    f"INSERT INTO {Follower._meta.db_table} (run_id, expires_at) "
                    "VALUES ('r1', now() + interval '10 seconds')"
                )
                w.store.insert("r1", "note", "{}")  # unfenced: the trigger hashes it
                raw.execute("SELECT 1")  # the notification arrives with a reply
                return len(heard)

            follower = run(w, Driver("d2"), "follow", notified)
            assert follower.result == 1, follower.outcome
        finally:
            w.teardown()


@pytest.mark.parametrize("crash", [True, False])
def test_a_crashed_process_is_taken_over_at_once(lane, crash):
    """A process's liveness locks go with it: its live lease is taken at once after a crash
    (instant takeover), and only expires by the clock while it is merely suspended."""
    w = _world()
    with patched(w):
        try:

            def hold() -> None:
                w.store.create_run(RunInfo("r1", agent="a"))
                assert w.store.acquire_lease("r1", "a", "token-a", 30.0)
                w.point("holding")

            holder = run(w, Driver("d1"), "hold", hold, until="holding")
            assert w.lane.session(holder).liveness.held == {"token-a"}
            if crash:
                w.crash(holder)
            w.advance(1.0)  # long before the lease expires
            taker = run(
                w, Driver("d2"), "take", lambda: w.store.acquire_lease("r1", "b", "t-b", 30)
            )
            if crash:
                assert taker.result and taker.result.previous.token == "token-a"
            else:
                assert taker.result is None
        finally:
            w.teardown()
