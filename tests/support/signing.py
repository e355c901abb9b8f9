"""Ed25519 keys for approvers who sign their decisions."""

from __future__ import annotations

import base64

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
