"""A small supervisor for Celery processes, as ``restart: unless-stopped`` or systemd's
``Restart=always`` would be: it starts a process again when it exited."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.workers import CeleryProcess


@dataclass
class Supervised:
    start: Callable[[], CeleryProcess]
    process: CeleryProcess
    exits: list[tuple[str, int | None]] = field(default_factory=list)


class Supervisor:
    def __init__(self) -> None:
        self.supervised: list[Supervised] = []

    def add(self, start: Callable[[], CeleryProcess]) -> CeleryProcess:
        """Start a process with ``start`` and keep it running."""
        process = start()
        self.supervised.append(Supervised(start, process))
        return process

    def check(self) -> None:
        """Start again every supervised process that exited (call it while you wait)."""
        for entry in self.supervised:
            if not entry.process.alive():
                entry.exits.append((entry.process.name, entry.process.proc.returncode))
                entry.process = entry.start()

    def exits(self) -> list[tuple[str, int | None]]:
        return [e for entry in self.supervised for e in entry.exits]

    def logs(self) -> str:
        return "".join(entry.process.log() for entry in self.supervised)
