"""Issue 33: behind PgBouncer in transaction pooling mode (a real one, started by the
session: ``tests/support/pgbouncer.py``), a run is never driven twice and a dead worker's run
is still taken over — at once with a ``DIRECT_DATABASE`` holding the liveness locks, by lease
expiry without one.

Every child process reaches ``default`` through the pooler (``TRANSACTION_POOLING``, no
prepared statements); with ``direct`` it also has the ``direct`` alias on PostgreSQL itself.
The pool has fewer server connections than there are racers, so every statement may land on
a server connection another process used a moment ago: session state left there (a lock, a
prepared statement, a setting) would show. Side effects are counted outside the journal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from tests.support.agents import count_effects
from tests.support.chains import check_chain
from tests.support.procs import ROOT, subprocess_env
from tests.support.race import SLOW_AGENT
from tests.support.racing import RACERS, RUNS, check_run, race, total_busy

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "sqlite"]),
    pytest.mark.slow,
    pytest.mark.pgbouncer,
]

MODES = ["direct", "expiry"]
# Measured takeovers, printed at the end of the module (``-s``) for docs/pgbouncer.md.
MEASURED: dict[str, float] = {}


def _env(pgbouncer, mode: str, **more: str) -> dict[str, str]:
    return {**pgbouncer.env(direct=mode == "direct"), **more}


def _child(pgbouncer, mode: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.drive", *args],
        cwd=ROOT,
        env=subprocess_env(**_env(pgbouncer, mode, **env)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 90) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def _takeovers(run_id: str) -> list:
    return [r for r in Journal(DjangoStore()).records(run_id) if r.name.startswith(names.TAKEOVER)]


def _wait(predicate, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", MODES)
def test_eight_drivers_race_one_run_through_pgbouncer(pgbouncer, mode):
    run_id = f"pgb-race-{mode}-{uuid.uuid4().hex[:8]}"
    racers = race(SLOW_AGENT, [[run_id]] * RACERS, **_env(pgbouncer, mode))
    check_run(run_id, SLOW_AGENT, racers)
    assert total_busy(racers) > 0, racers
    assert _takeovers(run_id) == [], "a live driver's run was taken over behind the pooler"


@pytest.mark.timeout(240)
def test_eight_drivers_race_twenty_runs_through_pgbouncer(pgbouncer):
    tag = uuid.uuid4().hex[:8]
    run_ids = [f"pgb-race-{tag}-{i:02d}" for i in range(RUNS)]
    orders = []
    for p in range(RACERS):
        first = (p // 2) * (RUNS // (RACERS // 2))
        ring = run_ids[first:] + run_ids[:first]
        orders.append(ring if p % 2 == 0 else ring[:1] + ring[:0:-1])
    racers = race(SLOW_AGENT, orders, **_env(pgbouncer, "direct"))
    for run_id in run_ids:
        check_run(run_id, SLOW_AGENT, racers)
        assert _takeovers(run_id) == [], run_id


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", MODES)
def test_a_killed_driver_behind_pgbouncer_is_taken_over_and_a_live_one_never(pgbouncer, mode):
    """A driver hangs in its tool; a second process, through the pooler too, keeps trying to
    take the run. While the driver lives (several lease lengths), it never gets it. Once the
    driver is SIGKILLed, it does: within 2 s with ``DIRECT_DATABASE``, after the lease's
    expiry without."""
    ttl = 30 if mode == "direct" else 3
    run_id = f"pgb-kill-{mode}"
    store = DjangoStore()
    driver = _child(
        pgbouncer, mode, "hole-dawdle", run_id, "go", DA_DAWDLE="1", DA_LEASE_TTL=str(ttl)
    )
    resumer = None
    try:
        _wait(lambda: store.get(run_id, "model:1") is not None, what="the driver's tool")
        lease = store.get_lease(run_id)
        assert lease is not None and lease.live
        resumer = _child(pgbouncer, mode, "hole-dawdle", run_id, DA_LEASE_TTL=str(ttl))
        alive_until = time.monotonic() + 3 * 3  # three short leases, renewed meanwhile
        while time.monotonic() < alive_until:
            assert _takeovers(run_id) == [], "a live driver's run was taken behind the pooler"
            assert resumer.poll() is None, resumer.communicate()
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.2)
        driver.kill()
        driver.communicate(timeout=30)
        killed = time.monotonic()
        _wait(lambda: _takeovers(run_id) != [], timeout=ttl + 10, what="the takeover")
        taken_after = time.monotonic() - killed
        out = _finish(resumer)
    finally:
        for proc in (driver, resumer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    MEASURED[mode] = taken_after
    print(f"\ntakeover behind pgbouncer ({mode}, LEASE_TTL {ttl} s): {taken_after:.2f} s")
    assert out == {"status": "finished", "answer": "shipped"}
    [takeover] = _takeovers(run_id)
    if mode == "direct":
        assert taken_after < 2, f"not taken over within 2 s of the kill: {taken_after:.2f}"
        assert takeover.get("reason") == "holder gone"
    else:
        assert takeover.get("reason") == "expired"
        assert taken_after <= ttl + 2, taken_after
    check_chain(run_id)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "crash,halts",
    [("after-result:call_1_1", set()), ("inside:call_1_2", {"call_1_2"})],
    ids=["after-result", "inside-the-effect"],
)
def test_a_sigkilled_side_effect_resumed_through_pgbouncer_never_fires_twice(
    pgbouncer, mode, crash, halts
):
    run_id = f"pgb-crash-{mode}-{crash.replace(':', '-')}"
    kill = (
        {"DA_CRASH_INSIDE": crash.split(":", 1)[1]}
        if crash.startswith("inside:")
        else {"DURABLE_AGENTS_CRASH_AT": crash}
    )
    # With DIRECT_DATABASE the lease is long: only the lost liveness lock frees the run.
    ttl = "30" if mode == "direct" else "2"
    first = _child(pgbouncer, mode, "crash-side_effect", run_id, "go", DA_LEASE_TTL=ttl, **kill)
    second = None
    try:
        out, err = first.communicate(timeout=90)
        assert first.returncode == -9, f"the driver was not killed\n{out}\n{err}"
        second = _child(pgbouncer, mode, "crash-side_effect", run_id, DA_LEASE_TTL=ttl)
        resumed = _finish(second)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    effects = count_effects(run_id)
    if halts:
        assert resumed["status"] == "halted", resumed
        assert {h.op_id for h in DjangoStore().list_halts(run_id=run_id)} == halts
        assert effects == {"call_1_1": 1, "call_1_2": 1}, effects
    else:
        assert resumed == {"status": "finished", "answer": "all done"}, resumed
        assert effects == {"call_1_1": 1, "call_1_2": 1, "call_2_1": 1}, effects
    [takeover] = _takeovers(run_id)
    assert takeover.get("reason") == ("holder gone" if mode == "direct" else "expired")
    check_chain(run_id)
