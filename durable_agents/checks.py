"""System checks: a bad ``DURABLE_AGENTS`` setting stops ``manage.py`` with a fix-it hint."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from . import conf


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    _, problems = conf.parse(getattr(django_settings, "DURABLE_AGENTS", None))
    return [
        checks.Error(
            problem,
            hint=(
                "Fix the DURABLE_AGENTS dict in your settings; the keys and their defaults "
                "are listed in docs/settings.md."
            ),
            id=f"durable_agents.E{index + 1:03d}",
        )
        for index, problem in enumerate(problems)
    ]
