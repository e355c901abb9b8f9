"""The stores the conformance suite runs every test on, and the database mark the database
stores' cases carry."""

from __future__ import annotations

import pytest

# Real commits: threads and child processes must see each other's writes.
DB = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])

# Only the database stores' cases carry the database mark: the in-memory store's run
# without a database (no set-up, no flush of both databases after each case), so a case
# that reaches for the database on the in-memory store is an error, not a quiet pass.
STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("postgres", id="postgres", marks=DB),
    pytest.param("sqlite", id="sqlite", marks=DB),
]
