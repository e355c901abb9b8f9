"""System checks: what a site would otherwise learn only when a run needs its agent, each
under its own stable id; and the beat entry built from the settings."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.test.utils import override_settings

import durable_agents as da
from durable_agents.celery.schedule import beat_schedule

pytestmark = pytest.mark.usefixtures("site_urls")


def _ours(**settings):
    with override_settings(**settings):
        return [m for m in run_checks() if m.id.startswith("durable_agents.")]


def _agents(*paths: str) -> dict:
    # The suite's webhook secret: the URLconf mounts a webhook, which E008 would report.
    return {"DURABLE_AGENTS": _secret({"AGENTS": list(paths), "DISPATCH": "inline"})}


def _secret(raw: dict) -> dict:
    """``raw`` with the suite's webhook secret: the URLconf mounts a webhook (E008 else)."""
    return {**raw, "WEBHOOK_SECRET": django_settings.DURABLE_AGENTS["WEBHOOK_SECRET"]}


def test_the_suite_settings_are_clean():
    assert _ours() == []


def test_a_misspelled_agent_path_is_an_error_quoting_the_import():
    [error] = _ours(**_agents("example_project.agents.suport"))
    assert error.id == "durable_agents.E002"
    assert "'example_project.agents.suport'" in error.msg
    assert 'does not define a "suport" attribute' in error.msg
    assert "https://" in error.hint and "settings.md" in error.hint


def test_a_missing_module_is_an_error_naming_it():
    [error] = _ours(**_agents("shop.agents.support"))
    assert error.id == "durable_agents.E002" and "No module named 'shop'" in error.msg


def test_a_path_that_names_no_agent_is_an_error():
    [error] = _ours(**_agents("tests.support.check_agents.not_an_agent"))
    assert error.id == "durable_agents.E002" and "not an Agent" in error.msg


def test_two_agents_with_one_name_are_an_error():
    [error] = _ours(
        **_agents("tests.support.check_agents.twin_a", "tests.support.check_agents.twin_b")
    )
    assert error.id == "durable_agents.E003" and "'check-twin'" in error.msg
    # The same agent listed twice (as itself and through its module) is not a conflict.
    assert _ours(**_agents("tests.support.agents.echo", "tests.support.agents")) == []


def test_a_module_path_finds_every_agent_in_it():
    [error] = _ours(**_agents("tests.support.check_agents"))
    assert error.id == "durable_agents.E003"


def test_runtime_loading_refuses_the_same_conflicts():
    from durable_agents.agent_loader import configured_agents

    with pytest.raises(da.ConfigError, match="two agents are named 'check-twin'") as info:
        configured_agents(["tests.support.check_agents"])
    assert info.value.code == "config.agent_duplicate"
    with pytest.raises(da.ConfigError, match="cannot be imported") as info:
        configured_agents(["example_project.agents.suport"])
    assert info.value.code == "config.agents"


def test_beat_schedule_follows_the_queue_and_interval():
    entry = beat_schedule({"CELERY_QUEUE": "agents-eu", "RECOVERY_INTERVAL": 7})[
        "durable-agents-recover"
    ]
    assert entry == {
        "task": "durable_agents.tasks.recover_runs",
        "schedule": 7.0,
        "options": {"queue": "agents-eu", "expires": 7.0},
    }
    assert beat_schedule()["durable-agents-recover"]["options"]["queue"] == "durable_agents"
    with pytest.raises(da.ConfigError, match="RECOVERY_INTERVAL"):
        beat_schedule({"RECOVERY_INTERVAL": -1})


def test_beat_schedule_sweeps_timers_on_its_own_interval():
    entry = beat_schedule({"CELERY_QUEUE": "agents-eu", "TIMER_SWEEP_INTERVAL": 3})[
        "durable-agents-wake-timers"
    ]
    assert entry == {
        "task": "durable_agents.tasks.wake_timers",
        "schedule": 3.0,
        "options": {"queue": "agents-eu", "expires": 3.0},
    }
    assert beat_schedule()["durable-agents-wake-timers"]["schedule"] == 5.0
    with pytest.raises(da.ConfigError, match="TIMER_SWEEP_INTERVAL"):
        beat_schedule({"TIMER_SWEEP_INTERVAL": 0})


def test_a_beat_entry_on_another_queue_is_a_warning():
    stale = beat_schedule({"CELERY_QUEUE": "old-queue"})
    [warning] = _ours(
        DURABLE_AGENTS=_secret({"DISPATCH": "celery", "CELERY_QUEUE": "agents"}),
        CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
        CELERY_BEAT_SCHEDULE=stale,
    )
    assert warning.id == "durable_agents.W001" and "'old-queue'" in warning.msg
    assert "beat_schedule" in warning.hint
    fresh = beat_schedule({"CELERY_QUEUE": "agents"})
    assert (
        _ours(
            DURABLE_AGENTS=_secret({"DISPATCH": "celery", "CELERY_QUEUE": "agents"}),
            CELERY_BROKER_URL="redis://127.0.0.1:6379/9",
            CELERY_BEAT_SCHEDULE=fresh,
        )
        == []
    )


def test_celery_dispatch_without_a_broker_is_a_warning():
    with override_settings(DURABLE_AGENTS=_secret({"DISPATCH": "celery"})):
        from django.conf import settings

        del settings.CELERY_BROKER_URL
        [warning] = [m for m in run_checks() if m.id.startswith("durable_agents.")]
    assert warning.id == "durable_agents.W002" and "amqp://guest@localhost" in warning.msg
