"""Live events: commit-to-client latency, and what the journal's trigger costs a write.

On the local PostgreSQL, in one run:
  (1) the journal insert with its trigger (migrations 0009, 0010: it chains the record and
      notifies the run's followers; nobody follows this run) disabled and enabled, each
      interleaved with a raw psycopg autocommit INSERT of the same row (the ratio the other
      benches print);
  (2) latency from the start of a fenced journal insert (its commit included) until the
      record reaches a client: the Python iterator (``durable_agents.database.events.events``) and
      the SSE stream (``GET /api/agents/runs/{id}/events`` over HTTP to a threaded WSGI
      server in this process). Records are written one at a time, ``--gap`` ms apart.
Prints medians and p99; the last line is the result (latency ratio = SSE p50 / raw INSERT).

    .venv/bin/python bench/events.py [--records 500] [--gap 5]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import threading
import time
import uuid

from _setup import median_us, payload, raw_connection, setup_django, timed


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--gap", type=float, default=5.0, help="ms between records")
    args = parser.parse_args()
    setup_django()

    from django.contrib.auth.models import User
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application
    from django.db import connection, connections

    from durable_agents.api.auth import issue_api_key
    from durable_agents.database.events import events
    from durable_agents.database.store import site_store
    from durable_agents.engine.ports import FINISHED, RUNNING, RunInfo

    store = site_store()
    raw = raw_connection()
    data = payload()
    tag = uuid.uuid4().hex[:8]

    # -- (1) the trigger's cost on the hot path ------------------------------------------
    run_id = f"bench-ev-{tag}"
    store.create_run(RunInfo(run_id=run_id, agent="bench", status=RUNNING))
    token = uuid.uuid4().hex
    assert store.acquire_lease(run_id, "bench", token, 3600)

    def series(label: str) -> tuple[float, float]:
        a: list[float] = []
        b: list[float] = []
        for i in range(-200, args.steps):  # the first 200: warm-up
            ta = timed(
                lambda i=i: raw.execute(
                    "INSERT INTO bench_raw_journal (run_id, name, data) VALUES (%s, %s, %s)",
                    [f"raw-{run_id}", f"{label}:{i}", data],
                )
            )
            tb = timed(lambda i=i: store.insert(run_id, f"{label}:{i}", data, fence=token))
            if i >= 0:
                a.append(ta)
                b.append(tb)
        return median_us(a), median_us(b)

    def triggers(enable: bool) -> None:
        verb = "ENABLE" if enable else "DISABLE"
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE durable_agents_journalentry {verb} "
                "TRIGGER durable_agents_journal_chain"
            )

    triggers(False)
    try:
        raw_off, off = series("off")
    finally:
        triggers(True)
    raw_on, on = series("on")

    # -- (2) latency to a client ---------------------------------------------------------
    user = User.objects.filter(username="bench-events").first() or User.objects.create_user(
        "bench-events", is_staff=True, is_superuser=True
    )
    _, key = issue_api_key(user, "bench")
    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler, allow_reuse_address=True)
    server.set_app(get_wsgi_application())
    WSGIRequestHandler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    live = f"bench-live-{tag}"
    store.create_run(RunInfo(run_id=live, agent="bench", status=RUNNING))
    live_token = uuid.uuid4().hex
    assert store.acquire_lease(live, "bench", live_token, 3600)
    store.insert(live, "warm", data, fence=live_token)
    arrived: dict[str, dict[int, float]] = {"python": {}, "sse": {}}
    ready = threading.Barrier(3)

    def python_client() -> None:
        stream = events(live)
        next(stream)  # the warm record: listening, backlog read
        ready.wait()
        for record in stream:
            arrived["python"][record.seq] = time.perf_counter()
        connections.close_all()

    def sse_client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/api/agents/runs/{live}/events", headers={"X-API-Key": key})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        seq = None
        warmed = False
        while True:
            line = response.readline().decode()
            if not line:
                return
            if line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: ") and seq is not None:
                if warmed:
                    arrived["sse"][seq] = time.perf_counter()
                else:
                    warmed = True
                    ready.wait()
                seq = None

    clients = [threading.Thread(target=python_client), threading.Thread(target=sse_client)]
    for client in clients:
        client.start()
    ready.wait()
    started: dict[int, float] = {}
    for i in range(args.records):
        t0 = time.perf_counter()
        entry, _ = store.insert(live, f"live:{i}", data, fence=live_token)
        started[entry.seq] = t0
        time.sleep(args.gap / 1000)
    store.update_run(live, {"status": FINISHED}, fence=live_token)
    for client in clients:
        client.join(60)
    server.shutdown()

    latency = {
        name: [got[seq] - started[seq] for seq in started if seq in got]
        for name, got in arrived.items()
    }
    for name, samples in latency.items():
        assert len(samples) == args.records, f"{name}: {len(samples)} of {args.records}"

    raw.execute("DELETE FROM bench_raw_journal WHERE run_id = %s", [f"raw-{run_id}"])
    store.release_lease(run_id, token)
    store.release_lease(live, live_token)
    store.delete_run(run_id)
    store.delete_run(live)

    ra = (raw_off + raw_on) / 2
    py50, py99 = median_us(latency["python"]), p99(latency["python"])
    sse50, sse99 = median_us(latency["sse"]), p99(latency["sse"])
    print(f"steps per series            {args.steps} (interleaved), record {len(data)} bytes")
    print(f"raw INSERT                  {raw_off:8.1f} / {raw_on:8.1f} us median (off / on)")
    print(f"journal insert, no trigger  {off:8.1f} us median  ({off / raw_off:.2f}x raw)")
    print(f"journal insert, chain+probe {on:8.1f} us median  ({on / raw_on:.2f}x raw)")
    print(f"records followed            {args.records}, {args.gap:g} ms apart")
    print(f"Python iterator latency     p50 {py50:8.1f} us  p99 {py99:8.1f} us")
    print(f"SSE over HTTP latency       p50 {sse50:8.1f} us  p99 {sse99:8.1f} us")
    print(
        f"RESULT events sse_p50_us={sse50:.0f} sse_p99_us={sse99:.0f} "
        f"py_p50_us={py50:.0f} py_p99_us={py99:.0f} ratio={sse50 / ra:.2f} "
        f"insert_ratio={on / raw_on:.2f} insert_ratio_without_trigger={off / raw_off:.2f}"
    )


if __name__ == "__main__":
    main()
