"""The staff admin, one module per page family; importing the package registers them."""

from . import runs  # noqa: F401  (registers every durable_agents model admin)
