"""A real PgBouncer of a test's own in transaction pooling mode, in front of the suite's
PostgreSQL (127.0.0.1:5432, trust auth): its ini in a temporary directory, a free local
port, started and stopped by the test session as a subprocess.

Debian's ``pgbouncer`` (``./scripts/test`` installs it with apt-get). PgBouncer refuses to
run as root: as root it is started with ``-u postgres`` and its directory handed to that
user, as ``pg_cluster.py`` does for ``initdb``. A missing binary or a pooler that does not
answer fails the test; it never skips.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.redis_server import free_port

UPSTREAM_HOST = "127.0.0.1"
UPSTREAM_PORT = 5432
# Fewer server connections than the racers that share them: every client's statements land
# on server connections other clients used a moment ago, which is what breaks session state.
POOL_SIZE = 4


def binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if found is None:
        raise AssertionError(
            "pgbouncer is not installed (./scripts/test installs it: apt-get install pgbouncer)"
        )
    return found


class PgBouncer:
    """``start()``, then point children at ``port`` (``env``), then ``stop()``."""

    def __init__(self) -> None:
        self.binary = binary()
        # Not under pytest's tmp_path: as root that is private to root, and PgBouncer runs
        # as postgres.
        self.workdir = Path(tempfile.mkdtemp(prefix="da-pgbouncer-"))
        self.port = free_port()
        self.ini = self.workdir / "pgbouncer.ini"
        self.log = self.workdir / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def write_ini(self) -> None:
        self.ini.write_text(
            "[databases]\n"
            f"* = host={UPSTREAM_HOST} port={UPSTREAM_PORT} user=postgres\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "min_pool_size = 0\n"
            "max_client_conn = 400\n"
            # Idle server connections are closed soon: the test databases can be dropped.
            "server_idle_timeout = 5\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            # Hundreds of short-lived clients per test: log what goes wrong, not each login.
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            f"logfile = {self.log}\n"
            # SHOW POOLS, CLIENTS, SERVERS on the admin console, when a test needs a look.
            "admin_users = postgres\n"
        )

    def start(self) -> None:
        self.write_ini()
        args = [self.binary]
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in (self.workdir, self.ini):
                os.chown(path, user.pw_uid, user.pw_gid)
            args += ["-u", "postgres"]
        # Its output to a file, never a pipe: PgBouncer also logs to stderr, and a pipe nobody
        # reads fills up and stops it mid-run (every client then hangs at login).
        out = os.open(self.workdir / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = subprocess.Popen(
                [*args, "-q", str(self.ini)], stdout=subprocess.DEVNULL, stderr=out
            )
        finally:
            os.close(out)
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    out = (self.workdir / "stderr.log").read_text(errors="replace")
                    log = self.log.read_text(errors="replace") if self.log.exists() else ""
                    self.stop()
                    raise AssertionError(
                        f"pgbouncer did not start on port {self.port}: {exc}\n{out}\n{log}"
                    ) from exc
                time.sleep(0.1)

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user=postgres"

    def env(self, *, direct: bool) -> dict[str, str]:
        """A child's environment: its ``default`` database through this pooler, with
        ``TRANSACTION_POOLING`` on; ``direct``: with a ``direct`` alias on PostgreSQL itself
        as ``DIRECT_DATABASE`` (instant takeover), else none (lease expiry)."""
        env = {"DA_PG_PORT": str(self.port), "DA_POOLING": "1", "DA_DIRECT_DATABASE": ""}
        env["DA_PG_DIRECT_PORT"] = str(UPSTREAM_PORT)
        if direct:
            env["DA_DIRECT_DATABASE"] = "direct"
        return env

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
