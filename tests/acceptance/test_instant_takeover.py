"""Issue 17, instant takeover (PostgreSQL): a driver whose process died (SIGKILL) gives its
run up at once — its lease's liveness lock went with its connection — while a driver that is
only stopped (SIGSTOP) keeps its lease until it expires, and is fenced after that as before.
Both takeovers are journaled (``@takeover/…``), with why the lease could be taken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_agents as da
from durable_agents.database.store import DjangoStore
from durable_agents.engine import names
from durable_agents.engine.journal import Journal
from tests.support.agents import count_effects
from tests.support.procs import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _child(run_id: str, agent: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.drive", agent, run_id, "go"],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "T"
    except FileNotFoundError:
        return False


def _takeovers(run_id: str) -> list:
    records = Journal(DjangoStore()).records(run_id)
    return [r for r in records if r.name.startswith(names.TAKEOVER)]


@pytest.mark.timeout(90)
def test_a_killed_driver_is_taken_over_within_two_seconds():
    run_id = "instant-kill"
    store = DjangoStore()
    driver = _child(run_id, "hole-dawdle", DA_DAWDLE="1", DA_LEASE_TTL="30")
    try:
        _wait(
            lambda: store.get(run_id, "model:1") is not None,
            what="the driver to be inside its tool",
        )
        lease = store.get_lease(run_id)
        assert lease is not None and lease.live
        with pytest.raises(da.RunBusy):
            da.resume(run_id)  # a live driver keeps its run
        driver.kill()
        driver.communicate(timeout=30)
        killed = time.monotonic()
        while True:
            try:
                result = da.resume(run_id)
                break
            except da.RunBusy:
                assert time.monotonic() - killed < 2, "not taken over within 2 s of the kill"
                time.sleep(0.05)
        taken_after = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert result.answer == "shipped" and taken_after < 2
    assert (lease.expires_at - store.now()).total_seconds() > 20, "not by the lease's expiry"
    [takeover] = _takeovers(run_id)
    assert takeover.get("reason") == "holder gone"
    assert takeover.get("previous_holder") == lease.holder


@pytest.mark.timeout(120)
def test_a_stopped_driver_keeps_its_lease_until_it_expires_and_is_fenced():
    run_id = "instant-stop"
    store = DjangoStore()
    stalled = _child(run_id, "hole-charge", DA_LEASE_TTL="6", DA_STOP_INSIDE="call_1_1")
    try:
        _wait(lambda: _stopped(stalled.pid), what="the driver to stop inside the charge")
        stopped = time.monotonic()
        lease = store.get_lease(run_id)
        while True:  # its process is alive: its lease holds until it expires
            try:
                da.resume(run_id)
            except da.RunBusy:
                assert time.monotonic() - stopped < 30, "the lease never expired"
                time.sleep(0.2)
                continue
            except da.OutcomeUnknown:
                break  # taken over: the claimed charge halts the run
        assert time.monotonic() - stopped > 2, "the lease was taken before it expired"
        assert not lease.live or lease.expires_at <= store.now()
        os.kill(stalled.pid, signal.SIGCONT)
        out, err = stalled.communicate(timeout=60)
    finally:
        if stalled.poll() is None:
            stalled.kill()
            stalled.communicate()
    assert json.loads(out.strip().splitlines()[-1])["code"] == "run.lease_lost", err
    assert count_effects(run_id) == {"call_1_1": 1}
    assert Journal(store).get(run_id, "tool:call_1_1") is None
    [takeover] = _takeovers(run_id)
    assert takeover.get("reason") == "expired"
    assert takeover.get("previous_holder") == lease.holder


@pytest.mark.timeout(60)
def test_with_instant_takeover_off_a_killed_driver_keeps_its_run_until_the_lease_expires(
    settings,
):
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "INSTANT_TAKEOVER": False}
    run_id = "instant-off"
    store = DjangoStore()
    driver = _child(run_id, "hole-dawdle", DA_DAWDLE="1", DA_LEASE_TTL="30")
    try:
        _wait(lambda: store.get(run_id, "model:1") is not None, what="the driver's tool")
        driver.kill()
        driver.communicate(timeout=30)
        killed = time.monotonic()
        while time.monotonic() - killed < 2.5:  # with it on, taken within 2 s (above)
            with pytest.raises(da.RunBusy):
                da.resume(run_id)
            time.sleep(0.1)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()


def _backend_alive(pid: int) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone()[0] > 0


@pytest.mark.timeout(90)
def test_a_driver_whose_tool_closed_its_connection_keeps_its_run_until_it_dies(tmp_path):
    """A tool that closes the driving thread's Django connection (``close_old_connections``,
    ``connection.close()``) does not make a live driver look dead: neither recovery nor a
    resume takes its run. Once its process is killed, a resume takes the run at once."""
    from durable_agents.celery.recovery import recover
    from tests.support.wiring import wired

    run_id = "instant-hang-up"
    mark = tmp_path / "closed"
    driver = _child(run_id, "hole-hang-up", DA_CLOSED_AT=str(mark), DA_LEASE_TTL="30")
    try:
        _wait(mark.exists, what="the tool to close its connection")
        _wait(lambda: mark.read_text() != "", what="the tool to write its old backend's pid")
        old = int(mark.read_text())
        _wait(lambda: not _backend_alive(old), what="the closed connection's backend to exit")
        sent: list[str] = []
        with wired(dispatcher=sent.append):
            assert run_id not in recover(interval=0), "recovery took a live driver's run"
        assert sent == []
        with pytest.raises(da.RunBusy):
            da.resume(run_id)
        assert driver.poll() is None, "the driver is still running"
        driver.kill()
        driver.communicate(timeout=30)
        killed = time.monotonic()
        while True:
            try:
                result = da.resume(run_id)
                break
            except da.RunBusy:
                assert time.monotonic() - killed < 2, "not taken over within 2 s of the kill"
                time.sleep(0.05)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert result.answer == "shipped"
    [takeover] = _takeovers(run_id)
    assert takeover.get("reason") == "holder gone"
