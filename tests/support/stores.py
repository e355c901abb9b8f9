"""The stores the conformance suite runs every test on, and the database mark those tests
carry."""

from __future__ import annotations

import pytest

STORES = ["memory", "postgres", "sqlite"]

# Real commits: threads and child processes must see each other's writes.
DB = pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
