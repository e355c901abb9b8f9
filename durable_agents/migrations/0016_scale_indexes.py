"""Indexes for a site with a million runs (issue 33): the runs list newest first (admin and
API, with their keyset pages), and the run page's reads of its tree and its forks, which
were sequential scans of the runs table.

On PostgreSQL each index is built ``CONCURRENTLY``: a site upgrading with a large runs table
keeps writing runs while it builds (the migration is not atomic for that reason; a build
that fails leaves an invalid index, which ``DROP INDEX`` removes before migrating again).
Elsewhere (SQLite) it is a plain ``CREATE INDEX``.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.migrations.operations import AddIndex


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """``AddIndexConcurrently`` on PostgreSQL, ``AddIndex`` on any other database."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("durable_agents", "0015_key_confirmation"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="run",
            index=models.Index(fields=["-created_at", "-run_id"], name="da_run_created"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="run",
            index=models.Index(
                condition=models.Q(("root_run_id__isnull", False)),
                fields=["root_run_id"],
                name="da_run_root",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="run",
            index=models.Index(
                condition=models.Q(("forked_from__isnull", False)),
                fields=["forked_from"],
                name="da_run_forked",
            ),
        ),
    ]
