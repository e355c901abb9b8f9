"""The run page's timeline describes each record kind once (``admin.timeline.DESCRIBERS``,
keyed by ``engine.views``' kinds): one record of every kind, and what the page says of it."""

from __future__ import annotations

from datetime import UTC, datetime

from durable_agents.admin.timeline import agent_drift, build_timeline
from durable_agents.engine.records import Record, encode

AT = datetime(2026, 1, 1, tzinfo=UTC)
TALLY = {
    "need": 2,
    "approved_by": ["ann", "lena"],
    "decisions": [{"approver": "lena", "deputy": "leo"}],
}
JOURNAL = [
    ("@journal", {"format": "durable_agents.journal.v1"}),
    ("run:start", {"agent": "a", "input": "hi", "fingerprint": {"hash": "h", "tools": {}}}),
    (
        "model:1",
        {
            "message": {
                "role": "assistant",
                "content": "on it",
                "tool_calls": [{"id": "c1", "name": "refund", "arguments": '{"a":1}'}],
            },
            "usage": {"input_tokens": 3, "output_tokens": 4},
            "model": "m",
            "finish": "tool_calls",
        },
    ),
    ("model:x", {}),
    ("attempt:c1:1", {"tool": "refund", "attempted_at": 1700000000000}),
    ("attempt:compensate:c1:2", {"tool": "refund"}),
    ("not-started:c1:1", {}),
    ("tool:c1", {"name": "refund", "result": {"ok": 1}, "is_error": False}),
    ("compensate:c1", {"name": "refund", "result": "undone", "is_error": False}),
    ("approval:c1", {"approved": True, "by": "ann", "tally": TALLY}),
    ("approval:c2", {"approved": False, "automatic": True, "rule": "small", "explain": "a<5"}),
    ("rule:c3", {"rule": "big", "outcome": "ask", "policy": {"need": 2}}),
    ("deadline:c3:remind", {"rule": "big"}),
    ("saga:abort", {"cause": {"code": "x", "message": "m"}, "calls": ["c1"]}),
    ("run:compensated", {"undone": ["c1"]}),
    ("run:complete", {"turns": 2, "answer": "done"}),
    ("run:cancelled", {"by": "ann", "reason": "r"}),
    ("fork", {"source": "s", "step": 2, "patch": {}}),
    ("fork:done", {}),
    ("@drift/abc", {"to": {"hash": "abc"}, "changes": {"model": ["a", "b"]}}),
    ("@takeover/n", {"reason": "expired", "holder": "h2", "previous_holder": "h1"}),
    ("@spend/1/n", {"why": "retry", "usage": {"input_tokens": 1}}),
    ("user:1", {"text": "hi", "then": ["more"]}),
    ("step:s1", {"value": {"v": 1}}),
    ("child:c5", {"run_id": "r/c5", "agent": "b"}),
    (
        "handle:c6",
        {
            "call_id": "c6",
            "tool": "t",
            "handle": {"kind": "mcp-task", "task_id": "t1", "server": "s"},
        },
    ),
    ("@progress/c6/n/1", {"call_id": "c6", "tool": "t", "progress": 2, "total": 5}),
    ("@unknown/attempt:c7:1", {"call_id": "c7", "tool": "t", "reason": {"type": "T"}}),
    ("@late/c1/1", {"call_id": "c1", "tool": "t", "attempt": 1, "outcome": "ok"}),
    ("wait:w:1", {"kind": "interrupt"}),
    ("@other", {}),
]
# (name, the entry's kind, its title), as the page showed them before the describers became a
# table.
SHOWN = [
    ("@journal", "internal", "Journal opened (format durable_agents.journal.v1)"),
    ("run:start", "start", "Run started by agent 'a'"),
    ("model:1", "model", "Model turn 1"),
    ("model:x", "tool-error", "model:x: unreadable"),
    ("attempt:c1:1", "attempt", "Attempt 1 of call c1 claimed"),
    ("attempt:compensate:c1:2", "attempt", "Undo of call c1: attempt 2 claimed"),
    ("not-started:c1:1", "attempt", "Attempt 1 of call c1 never started"),
    ("tool:c1", "tool", "Result of call c1 (refund)"),
    ("compensate:c1", "undo", "Undo of call c1 (refund)"),
    ("approval:c1", "approval", "Call c1 approved by ann"),
    ("approval:c2", "denial", "Call c2 refused by rule small: a<5"),
    ("rule:c3", "rule-asked", "Call c3 asked under rule big:  → 2 approvers"),
    ("deadline:c3:remind", "deadline-step", "Call c3: its approvers were reminded"),
    ("saga:abort", "cancelled", "Saga aborted: undoing its calls"),
    ("run:compensated", "complete", "Run compensated"),
    ("run:complete", "complete", "Run finished"),
    ("run:cancelled", "cancelled", "Run cancelled by ann"),
    ("fork", "fork", "Forked from run 's' at step 2"),
    ("fork:done", "internal", "Fork completely copied: from here it may be driven"),
    ("@drift/abc", "drift", "Resumed under a changed agent"),
    ("@takeover/n", "takeover", "Driver h2 took the run over from h1"),
    ("@spend/1/n", "internal", "Model spend without a turn (retry)"),
    ("user:1", "start", "User messages (2)"),
    ("step:s1", "meta", "Step s1"),
    ("child:c5", "child", "Call c5 started sub-run r/c5"),
    ("handle:c6", "child", "Call c6 (t) handed off MCP task t1 on server s"),
    ("@progress/c6/n/1", "internal", "Call c6 (t) in progress: 2 of 5"),
    ("@unknown/attempt:c7:1", "halt", "Call c7 (t) could not tell whether its effect happened"),
    ("@late/c1/1", "takeover", "Call c1 (t) settled after its driver lost the run to another"),
    ("wait:w:1", "meta", "wait:w:1"),
    ("@other", "meta", "@other"),
]


def _records() -> list[Record]:
    return [Record("r", name, seq, encode(body), AT) for seq, (name, body) in enumerate(JOURNAL, 1)]


def test_each_record_kind_is_described_as_before():
    timeline = build_timeline(_records())
    assert [(e["name"], e["kind"], e["title"]) for e in timeline] == SHOWN
    assert [e["number"] for e in timeline] == list(range(1, len(JOURNAL) + 1))
    steps = {e["name"]: e["step"] for e in timeline if e["step"] is not None}
    assert steps == {"run:start": 0, "model:1": 1}
    internal = [e["name"] for e in timeline if e["internal"]]
    assert internal == ["@journal", "fork:done", "@spend/1/n", "@progress/c6/n/1", "@other"]


def test_the_drift_panel_reads_the_start_and_drift_records():
    drift = agent_drift(_records(), fallback={"hash": "other"})
    assert drift["fingerprint"] == {"hash": "h", "tools": {}}
    assert [(d["seq"], d["hash"], d["changes"]) for d in drift["drifts"]] == [
        (20, "abc", ["model a → b"])
    ]
    assert agent_drift([], fallback={"hash": "f"})["fingerprint"] == {"hash": "f"}
