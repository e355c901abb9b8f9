"""Helpers of the import tests: a gated run approved by a signed decision, held before its
tool runs, and an export file's chains recomputed after a test changed it (the chain
function is public and unkeyed: anyone can)."""

from __future__ import annotations

import json

import pytest

import durable_agents as da
from durable_agents.engine.audit import ACTION_NAME, action_content, chain_hash
from durable_agents.models import ApprovalRequest, Run
from tests.support.agents import count_effects, gated
from tests.support.signing import signed_approval
from tests.support.wiring import wired


def signed_approval_held(run_id: str, private, ops) -> str:
    """A gated run whose approval (signed by ``ops``) is recorded, its tool not run yet: the
    hand-over after the decision is held."""
    held: list[str] = []
    with wired(dispatcher=held.append):
        gated.start("refund order 7", run_id=run_id)
        with pytest.raises(da.Pause):
            da.resume(run_id)
        request = ApprovalRequest.objects.get(run_id=run_id)
        signature = signed_approval(request, private, ops)
        da.approve(run_id, request.call_id, approved=True, by=ops, note="ok", signature=signature)
    assert run_id in held and Run.objects.get(run_id=run_id).status == "queued"
    assert count_effects(run_id) == {}
    return request.call_id


def rehashed(lines: list[dict]) -> str:
    """``lines`` as a file again: the records' chain and the stated head recomputed, the
    action rows' hashes too, the end line recounted."""
    prev = None
    out = []
    for item in lines:
        if item["type"] == "end":
            continue
        if item["type"] == "record":
            item["hash"] = prev = chain_hash(prev, item["name"], item["data"])
        elif item["type"] == "action":
            item["hash"] = chain_hash(item["prev"], ACTION_NAME, action_content(item))
        out.append(item)
    for item in out:
        if item["type"] == "run":
            item["head"] = prev
            item.pop("head_signature", None), item.pop("public_key", None)
    out.append({"type": "end", "lines": len(out)})
    return "\n".join(json.dumps(x) for x in out) + "\n"
