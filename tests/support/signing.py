"""Ed25519 keys for approvers who sign their decisions."""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def keypair() -> tuple[Ed25519PrivateKey, str]:
    """A fresh private key, and its public key as an approver registers it (raw, base64)."""
    private = Ed25519PrivateKey.generate()
    return private, public_text(private)


def public_text(private: Ed25519PrivateKey) -> str:
    """``private``'s public key as an approver registers it (raw, base64)."""
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(public).decode()


def signed_approval(
    request: Any, private: Ed25519PrivateKey, approver: Any, note: str = "ok"
) -> str:
    """``approver``'s signature of approving ``request`` (an ``ApprovalRequest`` row) as it
    stands, over this start of its run: what a signed decision relayed to the site carries."""
    from durable_agents.database.store import site_store
    from durable_agents.engine.approvals import decision_bytes, incarnation_of

    message = decision_bytes(
        incarnation=incarnation_of(site_store(), request.run_id),
        run_id=request.run_id,
        call_id=request.call_id,
        tool_name=request.tool_name,
        arguments=request.arguments,
        approver_id=str(approver.pk),
        approved=True,
        note=note,
    )
    return base64.b64encode(private.sign(message)).decode()
