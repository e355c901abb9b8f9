"""The example project's recorded runs, replayed against today's example agent: a change to
its instructions or tools that alters what the model would be sent fails here, with the
replay report (``durable_agents.testing.replay_cases``, docs/replay.md)."""

from __future__ import annotations

from durable_agents.testing import replay_cases
from tests.support.procs import ROOT

test_example_project_replays = replay_cases(ROOT / "example_project" / "replays" / "*.jsonl")
