"""A PostgreSQL cluster of a test's own: ``initdb`` into a temporary directory, a free port,
its socket in that directory. A test may stop it the hard way (``pg_ctl -m immediate``: the
server quits without a checkpoint, like a crash) and start it again, without touching the
suite's shared server on 5432, which the other tests use.

The server must not run as root: the data directory is given to the ``postgres`` user and
every ``pg_ctl``/``initdb`` runs as that user (``runuser``) when the test runs as root.
A missing ``initdb`` fails the test: the suite needs PostgreSQL's server binaries.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from tests.support.redis_server import free_port

START_TIMEOUT = 60.0


def server_bin() -> Path:
    """The newest installed PostgreSQL's ``bin`` directory (Debian's layout first)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise AssertionError(
        "initdb is not installed: the PostgreSQL crash tests need the server binaries "
        "(Debian: apt-get install postgresql)"
    )


def _version(path: str) -> tuple[int, ...]:
    part = Path(path).parents[1].name
    return tuple(int(p) for p in part.split(".") if p.isdigit())


class PrivateCluster:
    """One throwaway cluster: ``start``, ``crash`` (immediate stop), ``start`` again, ``stop``.

    ``settings`` are ``-c`` options given to the server at every start."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bin = server_bin()
        # Its own directory in the system's temp dir: pytest's are private to root, and the
        # server's user must reach its data directory and socket.
        self.workdir = Path(tempfile.mkdtemp(prefix="da-pg-"))
        self.data = self.workdir / "pgdata"
        self.socket_dir = self.workdir / "pgsock"
        self.log_path = self.workdir / "postgres.log"
        self.port = free_port()
        self.settings = settings or {}
        self._owner = "postgres" if os.geteuid() == 0 else None

    # -- running the server's programs -------------------------------------------------

    def _run(self, program: str, args: Sequence[str], timeout: float = START_TIMEOUT) -> str:
        cmd = [str(self.bin / program), *args]
        if self._owner:
            cmd = ["runuser", "-u", self._owner, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise AssertionError(
                f"{program} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}\n{done.stderr}\n{log[-4000:]}"
            )
        return done.stdout

    def _own(self, *paths: Path) -> None:
        if self._owner is None:
            return
        entry = pwd.getpwnam(self._owner)
        for path in paths:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def init(self) -> PrivateCluster:
        self.socket_dir.mkdir(exist_ok=True)
        self.log_path.touch()
        self._own(self.workdir, self.socket_dir, self.log_path)
        self._run(
            "initdb",
            ["-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"],
        )
        return self

    def start(self) -> PrivateCluster:
        options = [f"-p {self.port}", f"-k {self.socket_dir}", "-c listen_addresses=''"]
        options += [f"-c {key}={value}" for key, value in self.settings.items()]
        self._run(
            "pg_ctl",
            [
                *("-D", str(self.data), "-o", " ".join(options), "-l", str(self.log_path)),
                *("-w", "-t", str(int(START_TIMEOUT)), "start"),
            ],
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not self.up():
            if time.monotonic() > deadline:
                raise AssertionError(f"the private PostgreSQL did not come up:\n{self.log()}")
            time.sleep(0.05)
        return self

    def crash(self) -> None:
        """``pg_ctl -m immediate stop``: every server process quits at once, without a
        checkpoint and without writing what is still in its shared memory (the WAL buffers
        an asynchronous commit left there); the next start replays the log."""
        self._run("pg_ctl", ["-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def destroy(self) -> None:
        """Stop it if it runs and delete its directory; for the end of a test."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", ["-D", str(self.data), "-m", "immediate", "-w", "stop"])
            except AssertionError:
                pass  # it was not running after all
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    # -- clients ---------------------------------------------------------------------------

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.conninfo(dbname), autocommit=True, connect_timeout=5)

    def up(self) -> bool:
        try:
            with self.connect() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def create_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def env(self, dbname: str) -> dict[str, str]:
        """What ``tests.settings`` reads to put a child process's ``default`` database here."""
        return {
            "DA_PG_HOST": str(self.socket_dir),
            "DA_PG_PORT": str(self.port),
            "DA_PG_USER": "postgres",
            "DA_PG_NAME": dbname,
        }
