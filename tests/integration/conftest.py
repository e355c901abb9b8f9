"""Fixtures of the integration tests (helpers live in ``tests/support/``)."""

from __future__ import annotations

import pytest
from django.urls import get_resolver


@pytest.fixture
def site_urls() -> None:
    """The suite's URLconf, imported under the suite's own settings. Tests that run the
    system checks with a ``DURABLE_AGENTS`` of their own (no ``AGENTS``) would otherwise
    import it under theirs when they run first, and the webhook it mounts for the agent
    ``support`` refuses to be built without that agent (as it should on a real site)."""
    get_resolver().url_patterns  # noqa: B018 - importing is the point; resolvers are cached
