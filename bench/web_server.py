"""The example site's web server while staff watch live run pages: docker-compose.yml's web
command (gunicorn, gthread) beside the command it replaced (3 sync workers) and an ASGI
server (gunicorn running uvicorn workers on ``example_project.asgi``; needs
``pip install uvicorn-worker``, skipped without it), in interleaved rounds.

Each round starts each server in turn (order rotated every round) on the bench database with
the compose's environment (DEBUG off, HTTPS behind a proxy: requests carry
``X-Forwarded-Proto``), logs a staff member in, and opens run pages following one live run,
each as a browser does (the page, then its event stream). With 0, 3 and then 20 pages open,
it times 10 plain requests of the login page and 10 of ``/healthz`` (a request that does not
answer within 3 s counts as 3 s: stalled). With 20 open, it sends 400 requests of the login
page (no database) and then 400 of the admin index as the staff member (session, user and
permissions read from the database) from 8 client threads at once, and counts the
database's connections by application. Printed: each round, then per server the median and
range over the rounds. A stalled server is not measured further in that round.

The ASGI server runs with ``DATABASE_CONN_MAX_AGE=0``: Django's persistent connections
belong to the thread of one request under ASGI, and with the example's 60 s the admin
requests exhaust PostgreSQL's connections (``--asgi-conn-max-age 60`` shows it).

    .venv/bin/python bench/web_server.py [--rounds 5] [--only gthread,asgi]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from _setup import BENCH_DB, PG, ROOT, setup_django

sys.path.insert(0, str(ROOT))

from tests.support.compose import command, compose_environment
from tests.support.sse import Stream, records
from tests.support.web import PROXIED, Web

CAP = 3.0  # seconds: a plain request not answered by then is stalled
RUN_ID = "bench-live-page"
SERVERS = {
    "sync": ["gunicorn", "example_project.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"],
    "gthread": command("web"),
    "asgi": [
        *("gunicorn", "example_project.asgi", "--bind=0.0.0.0:8000", "--workers=2"),
        "--worker-class=uvicorn_worker.UvicornWorker",
    ],
}


def prepare(static_root: Path) -> None:
    """A staff user and a live run in the bench database; the static files collected."""
    setup_django()
    from django.contrib.auth.models import User

    from durable_agents.database.store import DjangoStore
    from durable_agents.engine.ports import RUNNING, RunInfo
    from durable_agents.models import Run

    User.objects.filter(username="bench-ann").delete()
    User.objects.create_superuser("bench-ann", "ann@example.com", "pw-bench-ann-1")
    Run.objects.filter(run_id=RUN_ID).delete()
    store = DjangoStore()
    store.create_run(RunInfo(run_id=RUN_ID, agent="support", status=RUNNING))
    store.insert(RUN_ID, "step:0", '{"kind":"step"}')
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=site_env(static_root),
        check=True,
    )


def site_env(static_root: Path, **extra: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DA_", "DJANGO_", "DATABASE_URL", "WEBHOOK_SECRET", "CELERY_"))
    }
    return {
        **base,
        **compose_environment("web"),
        "DATABASE_URL": f"postgres://{PG['user']}@{PG['host']}:{PG['port']}/{BENCH_DB}",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/8",
        "DJANGO_STATIC_ROOT": str(static_root),
        "DURABLE_AGENTS_LOG_LEVEL": "WARNING",
        **extra,
    }


def burst(fn: Callable[[], float], n: int = 400, clients: int = 8) -> tuple[float, float]:
    """``n`` calls from ``clients`` threads at once: (requests per second, median seconds)."""
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        took = list(pool.map(lambda _: fn(), range(n)))
    return n / (time.monotonic() - start), statistics.median(took)


def connections_by_application() -> dict[str, int]:
    with psycopg.connect(dbname="postgres", autocommit=True, **PG) as conn:
        rows = conn.execute(
            "SELECT coalesce(nullif(application_name, ''), 'django'), count(*) "
            "FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
            [BENCH_DB],
        ).fetchall()
    return {name: int(n) for name, n in rows}


def trial(name: str, args: list[str], env: dict[str, str], logs: Path) -> dict[str, float]:
    """One server: the figures of one round (``stalled`` at the number of pages it stalled)."""
    web = Web(args, env, logs / f"{name}.log")
    streams: list[Stream] = []
    figures: dict[str, float] = {}
    try:
        session = web.login("bench-ann", "pw-bench-ann-1")
        for pages in (0, 3, 20):
            while len(streams) < pages:
                status, _, _ = web.get("/healthz", timeout=CAP)
                if status != 200:  # the page itself would wait for ever
                    break
                stream = Stream(
                    web.events_url(RUN_ID, session),
                    {**PROXIED, "Cookie": session, "Accept": "text/event-stream"},
                )
                stream.start()
                streams.append(stream)
            deadline = time.monotonic() + 10
            while not all(records(s.events) for s in streams) and time.monotonic() < deadline:
                time.sleep(0.05)
            took = [web.timed("/admin/login/", CAP) for _ in range(10)]
            took += [web.timed("/healthz", CAP) for _ in range(10)]
            figures[f"p50@{pages}"] = statistics.median(took) * 1000
            figures[f"max@{pages}"] = max(took) * 1000
            if max(took) >= CAP or len(streams) < pages:
                figures["stalled"] = pages
                return figures
        figures["login/s"], _ = burst(lambda: web.timed("/admin/login/", 30))
        figures["admin/s"], _ = burst(lambda: web.timed("/admin/", 30, {"Cookie": session}), n=400)
        for app, n in connections_by_application().items():
            figures[f"conn:{app}"] = n
        return figures
    finally:
        web.stop()
        figures["worker timeouts"] = web.log().count("WORKER TIMEOUT")
        figures["errors"] = web.log().count("Traceback")
        for s in streams:
            s.join(timeout=10)
            s.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="sync,gthread,asgi")
    parser.add_argument("--asgi-conn-max-age", default="0")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    if "asgi" in names and importlib.util.find_spec("uvicorn_worker") is None:
        print("asgi: skipped (pip install uvicorn-worker)")
        names.remove("asgi")
    root = Path(tempfile.mkdtemp(prefix="da-web-bench-"))
    prepare(root / "static")
    envs = {n: site_env(root / "static") for n in names}
    if "asgi" in envs:
        envs["asgi"]["DATABASE_CONN_MAX_AGE"] = args.asgi_conn_max_age
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    try:
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                figures = trial(name, SERVERS[name], envs[name], root)
                results[name].append(figures)
                shown = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
                print(f"round {r + 1} {name:8} {shown}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"\n{args.rounds} rounds; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"on {os.cpu_count()} CPUs; times in ms, median (range) over the rounds"
    )
    for name in names:
        keys = list(dict.fromkeys(k for figures in results[name] for k in figures))
        shown = []
        for key in keys:
            values = [f[key] for f in results[name] if key in f]
            shown.append(
                f"{key} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
            )
        print(f"{name:8} " + "; ".join(shown))
        print(f"  command: {' '.join(SERVERS[name])}")


if __name__ == "__main__":
    main()
