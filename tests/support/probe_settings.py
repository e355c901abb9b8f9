"""The test settings without the example site's agents: importing ``example_project`` loads
its Celery app (its ``__init__.py`` does, as the README's site does), and the Celery probe
(``celery_probe``) must decide itself which app a process has."""

from tests.settings import *  # noqa: F403
from tests.settings import DURABLE_AGENTS

DURABLE_AGENTS = {**DURABLE_AGENTS, "AGENTS": ["tests.support.agents"]}
