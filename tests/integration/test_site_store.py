"""The site's one store (``durable_agents.database.store.site_store``): built once per settings,
shared by the engine's commands, the admin and the API, and built again when the settings
it reads change."""

from __future__ import annotations

import pytest
from django.test import override_settings

import durable_agents as da
from durable_agents.database.store import DjangoStore, site_store
from durable_agents.engine import runtime


def test_one_store_for_the_site_and_the_engine():
    store = site_store()
    assert isinstance(store, DjangoStore)
    assert site_store() is store
    assert runtime.store() is store  # what engine commands write through


def test_changed_settings_build_a_new_store(settings):
    before = site_store()
    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "DATABASE": "sqlite"}
    on_sqlite = site_store()
    assert on_sqlite is not before and on_sqlite.using == "sqlite"
    assert site_store() is on_sqlite

    with pytest.warns(UserWarning, match="DATABASES"):  # Django's caution; nothing changes
        settings.DATABASES = {**settings.DATABASES}
    assert site_store() is not on_sqlite and site_store().using == "sqlite"


def test_settings_put_back_give_the_first_database_again():
    with override_settings(DURABLE_AGENTS={"DATABASE": "sqlite", "PREPARED_STATEMENTS": False}):
        inside = site_store()
        assert (inside.using, inside.prepared) == ("sqlite", False)
    after = site_store()
    assert after is not inside and after.using == "default"


def test_invalid_settings_are_refused_on_every_call():
    with override_settings(DURABLE_AGENTS={"LEASE_TTL": 0}):
        for _ in range(2):
            with pytest.raises(da.ConfigError, match="invalid DURABLE_AGENTS"):
                site_store()
    assert site_store().using == "default"


def test_settings_edited_in_place_are_read_again(settings):
    """Parsed settings are kept while the value is unchanged; an edit inside the same dict
    (a test, a site that builds its settings late) is seen on the next read."""
    from durable_agents.conf import get_settings

    settings.DURABLE_AGENTS = {**settings.DURABLE_AGENTS, "LEASE_TTL": 30}
    first = get_settings()
    assert get_settings() is first
    settings.DURABLE_AGENTS["LEASE_TTL"] = 45
    assert get_settings().lease_ttl == 45
    settings.DURABLE_AGENTS["LEASE_TTL"] = 0
    with pytest.raises(da.ConfigError, match="LEASE_TTL"):
        get_settings()
