"""Redis shut down and restarted under load, with real Celery workers: do they survive?

Starts a Redis server of its own (``--port``, 6390 by default: never the shared 6379), a
PostgreSQL database of its own (``DA_RR_DB``, default ``da_redis_restart``, migrated, dropped
at the end), two ``celery -A redis_restart worker`` processes (this module: the test suite's
Celery app, ``tests.celery_app``, plus the overrides of ``--conf``) and, with ``--beat``, a
``celery beat`` sending a recovery pass every ``--interval`` seconds. Then:

1. starts ``--runs`` runs of the agent below: five turns, each calling ``effect``, a tool
   with a side effect (not retry-safe) that sleeps ``--tool-sleep`` s and then counts its
   fire in a table of its own (``rr_effects``), outside the journal;
2. once ``--after`` effects fired, ``redis-cli shutdown`` (no persistence: the queue and
   kombu's ``unacked`` hash are gone), waits ``--down`` s, starts Redis again;
3. watches for ``--deadline`` s: workers alive, runs by status, the queue's length.

Prints what happened and exits 1 if a worker exited (or, with ``--supervise``, which
restarts a worker that exited as a restart policy does, if one is missing at the end), a
run did not finish, or an effect fired twice. ``--late`` runs are started right after the
restart: they show whether the workers consume again, apart from recovery.

    .venv/bin/python bench/redis_restart.py [--pool threads|prefork|solo] [--concurrency 4]
        [--runs 40] [--beat] [--supervise] [--conf '{"worker_...": ...}'] [--repeat 3]

``--trace`` logs where a kombu channel of a closed connection asks for a new one (the
``'NoneType' object has no attribute 'hostname'`` crash); ``--conf '{"broker_transport":
"redis_restart:SurvivingTransport"}'`` runs the workers on the transport that survives it.
Since issue 17 tests/settings.py selects the product's version of it
(``durable_agents.celery.transport:Transport``) for every worker: pass ``--conf
'{"broker_transport": "redis"}'`` for kombu's own transport (the findings' baseline).
The logs of a failed attempt are kept and their path printed. See
docs/notes/redis-restart.md for what this found.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import durable_agents as da  # noqa: E402
from durable_agents.providers import scripted  # noqa: E402
from durable_agents.providers.scripted import ScriptedModel  # noqa: E402
from tests.celery_app import app  # noqa: E402

# In a worker (``celery -A redis_restart``) the overrides under test; nothing otherwise.
app.conf.update(json.loads(os.environ.get("DA_RR_CONF") or "{}"))


def _trace_orphan_channels() -> None:
    """``--trace``: log where a kombu Redis channel asks for connection parameters after its
    connection was closed (the ``'NoneType' object has no attribute 'hostname'`` path)."""
    import traceback

    from kombu.transport import redis as kombu_redis

    original = kombu_redis.Channel._connparams
    log = logging.getLogger("redis_restart")

    def _connparams(self, asynchronous=False):  # type: ignore[no-untyped-def]
        if self.connection is None or self.connection.client is None:
            log.warning(
                "orphan channel asks for a connection:\n%s", "".join(traceback.format_stack())
            )
        return original(self, asynchronous)

    kombu_redis.Channel._connparams = _connparams


if os.environ.get("DA_RR_TRACE"):
    _trace_orphan_channels()


from kombu.transport import redis as _kombu_redis  # noqa: E402
from redis import exceptions as _redis_errors  # noqa: E402


class _SurvivingChannel(_kombu_redis.Channel):
    def _connparams(self, asynchronous=False):  # type: ignore[no-untyped-def]
        if self.connection is None or self.connection.client is None:
            # The connection this channel belonged to was closed: say so with an error
            # every caller (celery's ignore_errors, ack_log_error, maybe_close_channel)
            # treats as a lost connection, instead of an AttributeError on None.hostname
            # that celery calls unrecoverable.
            logging.getLogger("redis_restart").warning(
                "a channel of a closed broker connection asks for a connection (averted)"
            )
            raise _redis_errors.ConnectionError("this channel's broker connection was closed")
        return super()._connparams(asynchronous)


class SurvivingTransport(_kombu_redis.Transport):
    """The fix under test: ``--conf '{"broker_transport": "redis_restart:SurvivingTransport"}'``.

    celery 5.7.0 closes the lost connection right after ``collect()`` detached its transport
    (``transport.client = None``). When ``collect()`` could not finish closing the default
    channel, that channel lives on half closed, without pools: closing it again restores its
    unacknowledged messages, and a task that finishes later acks on it; both need a new pool,
    and building one reads ``None.hostname``. The worker exits ("Unrecoverable error").
    """

    Channel = _SurvivingChannel


EFFECTS = 5
EFFECTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS rr_effects (id bigserial PRIMARY KEY, run_id text NOT NULL, "
    "call_id text NOT NULL, pid int NOT NULL, fired_at timestamptz NOT NULL DEFAULT now())"
)


def _pg(dbname: str) -> dict[str, str]:
    return {
        "dbname": dbname,
        "host": os.environ.get("DA_PG_HOST", "127.0.0.1"),
        "port": os.environ.get("DA_PG_PORT", "5432"),
        "user": os.environ.get("DA_PG_USER", "postgres"),
    }


@da.tool
def effect(item: int, ctx: da.ToolContext) -> dict:
    """Do a side effect to an item; not safe to repeat."""
    import psycopg

    time.sleep(float(os.environ.get("DA_RR_TOOL_SLEEP", "0.3")))
    with psycopg.connect(autocommit=True, **_pg(os.environ["DA_PG_NAME"])) as conn:
        conn.execute(
            "INSERT INTO rr_effects (run_id, call_id, pid) VALUES (%s, %s, %s)",
            [ctx.run_id, ctx.call_id, os.getpid()],
        )
    return {"done": item}


agent = da.Agent(
    "redis-restart",
    ScriptedModel(
        [scripted.calls(scripted.call("effect", {"item": i})) for i in range(EFFECTS)]
        + [scripted.text("done")]
    ),
    "Do every effect, in order.",
    [effect],
    max_turns=EFFECTS + 2,
)


# -- the driver --------------------------------------------------------------------------


class Redis:
    """A redis-server of this script's own, on its own port, without persistence."""

    def __init__(self, port: int, workdir: Path, persist: bool = False) -> None:
        self.port = port
        self.workdir = workdir
        # With persistence, SHUTDOWN saves a snapshot (dump.rdb in workdir) that the
        # restarted server loads: queues and kombu's unacked hash survive the restart.
        self.save = "3600 1" if persist else ""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True
        )

    def up(self) -> bool:
        return self.cli("ping").stdout.strip() == "PONG"

    def start(self) -> None:
        if self.up():
            raise SystemExit(f"something already answers on port {self.port}; pick --port")
        subprocess.run(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "yes",
                "--save",
                self.save,
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--pidfile",
                str(self.workdir / "redis.pid"),
                "--logfile",
                str(self.workdir / "redis.log"),
            ],
            check=True,
        )
        wait_for(self.up, 10, "redis-server to answer")

    def shutdown(self) -> None:
        self.cli("shutdown")
        wait_for(lambda: not self.up(), 10, "redis-server to stop")

    def queue_length(self, queue: str) -> int:
        # Kombu keeps a queue's messages in one list per priority step.
        total = 0
        for suffix in ("", "\x06\x163", "\x06\x166", "\x06\x169"):
            out = self.cli("llen", queue + suffix).stdout.strip()
            total += int(out) if out.isdigit() else 0
        return total


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Procs:
    """Celery workers and beat, each in its own process group, logs in ``logdir``."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], logdir: Path) -> None:
        self.args, self.env, self.logdir = args, env, logdir
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.beats: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[tuple[str, int | None]] = []

    def _popen(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "redis_restart", *argv],
            cwd=ROOT,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def worker(self, name: str) -> None:
        self.workers[name] = self._popen(
            name,
            [
                "worker",
                "--loglevel=INFO",
                *([] if self.args.events else ["--without-gossip", "--without-mingle"]),
                *([] if self.args.events else ["--without-heartbeat"]),
                "-Q",
                self.env["DA_CELERY_QUEUE"],
                "--pool",
                self.args.pool,
                "-c",
                str(self.args.concurrency),
                "-n",
                f"{name}-{uuid.uuid4().hex[:6]}@%h",
            ],
        )

    def beat(self) -> None:
        self.beats["beat"] = self._popen(
            "beat",
            ["beat", "--loglevel=INFO", "--max-interval=1", "-s", str(self.logdir / "sched")],
            DA_BEAT_RECOVERY="1",  # tests/celery_app.py: a recovery pass every interval
        )

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def ready(self) -> bool:
        return all(self.log(name).count("ready.") >= 1 for name in self.workers)

    def check(self, supervise: bool) -> None:
        """Note workers and beat that exited; restart them if supervising."""
        for name, proc in list(self.workers.items()):
            if proc.poll() is not None:
                self.exits.append((name, proc.returncode))
                del self.workers[name]
                if supervise:
                    self.worker(name)
        for name, proc in list(self.beats.items()):
            if proc.poll() is not None:
                self.exits.append((name, proc.returncode))
                del self.beats[name]
                if supervise:
                    self.beat()

    def stop(self) -> None:
        for proc in [*self.workers.values(), *self.beats.values()]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def attempt(args: argparse.Namespace, env: dict[str, str]) -> bool:
    import psycopg

    logdir = Path(tempfile.mkdtemp(prefix="redis-restart-"))
    redis = Redis(args.port, logdir, args.persist)
    queue = env["DA_CELERY_QUEUE"]
    rr = psycopg.connect(autocommit=True, **_pg(env["DA_PG_NAME"]))

    def scalar(sql: str, *params: object) -> int:
        return int(rr.execute(sql, params).fetchone()[0])

    tag = uuid.uuid4().hex[:6]
    runs = f"rr-{tag}-%"

    redis.start()
    procs = Procs(args, env, logdir)
    ok = False
    try:
        for i in range(args.workers):
            procs.worker(f"w{i}")
        if args.beat:
            procs.beat()
        wait_for(procs.ready, 60, "workers to be ready")

        for i in range(args.runs):
            agent.start("go", run_id=f"rr-{tag}-{i}")
        effects = "SELECT count(*) FROM rr_effects WHERE run_id LIKE %s"
        wait_for(lambda: scalar(effects, runs) >= args.after, 60, "effects")
        fired_before = scalar(effects, runs)
        redis.shutdown()
        down_at = time.monotonic()
        print(f"  redis shut down after {fired_before} effects; down for {args.down}s")
        while time.monotonic() - down_at < args.down:
            procs.check(args.supervise)
            time.sleep(0.1)
        redis.start()
        up_at = time.monotonic()
        # New work after the restart: a worker that reconnected but stopped consuming
        # leaves these queued even when recovery is off.
        for i in range(args.late):
            agent.start("go", run_id=f"rr-{tag}-late-{i}")

        def unfinished() -> int:
            return scalar(
                "SELECT count(*) FROM durable_agents_run WHERE run_id LIKE %s "
                "AND status NOT IN ('finished', 'halted', 'failed', 'cancelled')",
                runs,
            )

        def late_finished() -> int:
            return scalar(
                "SELECT count(*) FROM durable_agents_run WHERE run_id LIKE %s "
                "AND status = 'finished'",
                f"rr-{tag}-late-%",
            )

        max_queue = 0
        late_done: float | None = None
        while time.monotonic() - up_at < args.deadline:
            procs.check(args.supervise)
            max_queue = max(max_queue, redis.queue_length(queue))
            if late_done is None and late_finished() == args.late:
                late_done = time.monotonic() - up_at
            if unfinished() == 0:
                break
            time.sleep(0.25)
        settled = time.monotonic() - up_at
        statuses = dict(
            rr.execute(
                "SELECT status, count(*) FROM durable_agents_run WHERE run_id LIKE %s "
                "GROUP BY status ORDER BY status",
                [runs],
            ).fetchall()
        )
        doubles = scalar(
            "SELECT count(*) FROM (SELECT 1 FROM rr_effects WHERE run_id LIKE %s "
            "GROUP BY run_id, call_id HAVING count(*) > 1) d",
            runs,
        )
        fired = scalar(effects, runs)
        procs.check(args.supervise)
        alive = len(procs.workers)
        print(
            f"  after restart: {settled:.1f}s; workers alive {alive}/{args.workers}; "
            f"exits {procs.exits or 'none'}; the {args.late} runs started after the restart "
            + (f"finished in {late_done:.1f}s" if late_done is not None else "did not finish")
        )
        print(
            f"  runs {statuses}; effects {fired} (double {doubles}); "
            f"queue max {max_queue}, now {redis.queue_length(queue)}"
        )
        for name in sorted({name for name, _ in procs.exits}):
            for line in procs.log(name).splitlines():
                if "CRITICAL" in line:
                    print(f"  {name}: {line.strip()[:200]}")
                    break
        ok = (
            (args.supervise or not procs.exits)
            and alive == args.workers
            and set(statuses) <= {"finished"}
            and doubles == 0
        )
        return ok
    finally:
        procs.stop()
        if redis.up():
            redis.shutdown()
        rr.close()
        if ok and not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"  logs: {logdir}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=6390)
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork", "solo"])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--late", type=int, default=10, help="runs started after the restart")
    parser.add_argument("--tool-sleep", type=float, default=0.3)
    parser.add_argument("--after", type=int, default=20, help="effects fired before shutdown")
    parser.add_argument("--down", type=float, default=3.0, help="seconds Redis stays down")
    parser.add_argument("--persist", action="store_true", help="Redis saves and reloads")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds after restart")
    parser.add_argument("--beat", action="store_true", help="run celery beat (recovery)")
    parser.add_argument("--interval", type=float, default=5.0, help="recovery interval")
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--supervise", action="store_true", help="restart exited workers")
    parser.add_argument("--conf", default="{}", help="Celery settings for the workers (JSON)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--events", action="store_true", help="workers with gossip, mingle and heartbeat"
    )
    parser.add_argument("--trace", action="store_true", help="log orphan channel use")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    json.loads(args.conf)
    if not shutil.which("redis-server"):
        raise SystemExit("redis-server is not installed")

    import celery
    import kombu
    import psycopg
    import redis

    print(
        f"celery {celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}; "
        f"pool {args.pool} x{args.concurrency}, {args.workers} workers, {args.runs} runs "
        f"(+{args.late} after the restart); "
        f"beat {'on' if args.beat else 'off'}; Redis down {args.down}s, "
        f"{'persistent' if args.persist else 'no persistence'}; conf {args.conf}"
    )
    db = os.environ.get("DA_RR_DB", "da_redis_restart")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DA_PG_NAME": db,
        "DA_DISPATCH": "celery",
        "DA_CELERY_QUEUE": f"rr-{uuid.uuid4().hex[:8]}",
        "DA_BROKER_URL": f"redis://127.0.0.1:{args.port}/0",
        "DA_EXTRA_AGENTS": "redis_restart",
        "DA_LEASE_TTL": str(args.lease_ttl),
        "DA_RECOVERY_INTERVAL": str(args.interval),
        "DA_RR_TOOL_SLEEP": str(args.tool_sleep),
        "DA_RR_CONF": args.conf,
        "DA_RR_TRACE": "1" if args.trace else "",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "bench")]),
        "PYTHONUNBUFFERED": "1",
    }
    # This process drives nothing: it starts runs, through the workers' broker and queue.
    os.environ.update({k: v for k, v in env.items() if k.startswith("DA_")})
    with psycopg.connect(autocommit=True, **_pg("postgres")) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')
    import django
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    with psycopg.connect(autocommit=True, **_pg(db)) as conn:
        conn.execute(EFFECTS_TABLE)
    app.conf.broker_url = env["DA_BROKER_URL"]
    results = []
    try:
        for n in range(args.repeat):
            print(f"attempt {n + 1}/{args.repeat}")
            results.append(attempt(args, env))
            print(f"  {'OK' if results[-1] else 'FAILED'}")
    finally:
        connections.close_all()
        with psycopg.connect(autocommit=True, **_pg("postgres")) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    print(f"RESULT redis_restart ok={sum(results)}/{len(results)}")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
