"""Helpers for testing your own agents.

``InMemoryStore`` passes the same conformance suite as the PostgreSQL and SQLite stores;
use it to test tools and agents without a database. It cannot coordinate processes.

``replay_cases(path_or_glob)`` turns exported runs into pytest cases that replay each one
against today's agent code (docs/replay.md); ``ReplayModel`` answers from a journal.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .engine.definition import AgentDefinition
from .engine.errors import ConfigError
from .engine.export import parse
from .engine.memstore import InMemoryStore
from .engine.records import Record
from .engine.replay import ReplayReport, replay_records
from .engine.replay_model import ReplayModel

__all__ = ["InMemoryStore", "ReplayCase", "ReplayModel", "replay_cases"]


@dataclass(frozen=True)
class ReplayCase:
    """One exported run to replay: the file it is in and its run id."""

    path: Path
    run_id: str

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.run_id}"

    def records(self) -> list[Record]:
        with self.path.open(encoding="utf-8") as f:
            return parse(f).runs[self.run_id].records

    def replay(self, agent: AgentDefinition | None = None) -> ReplayReport:
        """Replay the run against ``agent`` (default: the agent registered under its name)."""
        return replay_records(self.records(), agent, run_id=self.run_id)

    def check(self, agent: AgentDefinition | None = None) -> ReplayReport:
        """Replay the run; fail the test with the replay report if today's code diverges."""
        import pytest

        report = self.replay(agent)
        if not report.identical:
            pytest.fail(f"{self.id}: {report.describe()}", pytrace=False)
        return report


def replay_cases(
    path_or_glob: str | Path, *, agent: AgentDefinition | None = None
) -> Callable[[ReplayCase], None]:
    """A pytest test, one case per run in the exported files ``path_or_glob`` matches
    (``manage.py durable_agents export``; a file exported ``--with-forks`` gives one case per
    run). Each case replays its run against today's agent code (``agent``, or the agent
    registered under the run's agent name) and fails with the replay report on divergence::

        test_recorded_runs = replay_cases(Path(__file__).parent / "replays" / "*.jsonl")

    A relative path is relative to the current directory. A pattern matching no file is a
    ``ConfigError`` when the module is collected, not a test that passes on nothing.
    """
    import pytest

    pattern = str(path_or_glob)
    paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
    if not paths:
        raise ConfigError(
            f"replay_cases: no exported run matches {pattern!r} (relative paths are relative "
            f"to {os.getcwd()!r})",
            code="config.replay_cases",
        )
    cases: list[ReplayCase] = []
    for path in paths:
        with path.open(encoding="utf-8") as f:
            cases.extend(ReplayCase(path, run_id) for run_id in parse(f).runs)

    @pytest.mark.parametrize("replay_case", cases, ids=[c.id for c in cases])
    def test_replay(replay_case: ReplayCase) -> None:
        replay_case.check(agent)

    return test_replay
