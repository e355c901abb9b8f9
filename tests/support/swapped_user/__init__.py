"""A site whose user model is swapped (``AUTH_USER_MODEL = "swapped_user.Person"``), for
tests/integration/test_swapped_user.py: durable_agents must migrate and work on it."""
