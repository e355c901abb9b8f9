"""The test settings without ``WEBHOOK_SECRET``, while the URLconf mounts the webhook: what a
deploy looks like when it migrates before its secrets are in place (issue 44, item 6)."""

from tests.settings import *  # noqa: F403
from tests.settings import DURABLE_AGENTS

DURABLE_AGENTS = {k: v for k, v in DURABLE_AGENTS.items() if k != "WEBHOOK_SECRET"}
