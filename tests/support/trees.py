"""A three-level tree of sub-agents whose leaf has a side effect before its gated call: what
the fork and budget tests of trees drive (unit and conformance). Effects go to a list the
test owns (``fired``), outside the journal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import durable_agents as da
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel

# Every call id is ``call_<turn>_1``: the middle is ``<root>/call_2_1`` and the leaf
# ``<root>/call_2_1/call_1_1``.
MIDDLE_CALL, LEAF_CALL = "call_2_1", "call_1_1"


def middle_of(root: str) -> str:
    return f"{root}/{MIDDLE_CALL}"


def leaf_of(root: str) -> str:
    return f"{middle_of(root)}/{LEAF_CALL}"


def fork_tree(
    prefix: str,
    fired: list[Any],
    *,
    gated: bool = True,
    during_charge: Callable[[da.ToolContext], None] | None = None,
    token_budget: int | None = None,
) -> tuple[da.Agent, da.Agent, da.Agent]:
    """``<prefix>-root`` looks something up (step 1), then asks ``<prefix>-middle`` (step 2)
    and answers (step 3); the middle asks ``<prefix>-leaf`` and answers; the leaf charges a
    card (a side effect: at most once; ``during_charge`` runs while it does), then sends a
    receipt (gated if ``gated``), then answers. Each scripted turn costs 15 tokens."""

    @da.tool(read_only=True)
    def lookup(city: str) -> str:
        return "sun"

    @da.tool
    def charge(cents: int, ctx: da.ToolContext) -> str:
        fired.append(("charge", ctx.run_id))
        if during_charge is not None:
            during_charge(ctx)
        return "charged"

    @da.tool(requires_approval=gated, idempotent=not gated)
    def send(to: str, ctx: da.ToolContext) -> str:
        fired.append(("send", ctx.run_id))
        return f"sent to {to}"

    leaf = da.Agent(
        f"{prefix}-leaf",
        ScriptedModel(
            [
                scripted.calls(scripted.call("charge", {"cents": 500})),
                scripted.calls(scripted.call("send", {"to": "bob"})),
                scripted.text("leaf done"),
            ]
        ),
        "Charge, then send the receipt.",
        [charge, send],
    )
    middle = da.Agent(
        f"{prefix}-middle",
        ScriptedModel(
            [
                scripted.calls(scripted.call(leaf.name, {"input": "errand"})),
                scripted.text("middle done"),
            ]
        ),
        "Delegate the errand.",
        [leaf.as_tool()],
    )
    root = da.Agent(
        f"{prefix}-root",
        ScriptedModel(
            [
                scripted.calls(scripted.call("lookup", {"city": "Oslo"})),
                scripted.calls(scripted.call(middle.name, {"input": "plan"})),
                scripted.text("root done"),
            ]
        ),
        "Look up, then delegate.",
        [lookup, middle.as_tool()],
        token_budget=token_budget,
    )
    return root, middle, leaf
