"""The test settings with a swapped user model, on one SQLite database (``DA_SWAPPED_DB``)."""

import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.swapped_user"]  # noqa: F405
AUTH_USER_MODEL = "swapped_user.Person"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["DA_SWAPPED_DB"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    }
}
DURABLE_AGENTS = {**DURABLE_AGENTS, "DATABASE": "default"}  # noqa: F405
