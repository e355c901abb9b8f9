"""Indexes for a site with a million runs (issue 33): the runs list newest first (admin and
API, with their keyset pages), and the run page's reads of its tree and its forks, which
were sequential scans of the runs table.

On PostgreSQL the journal's ``run_id`` is also given a fixed ratio of distinct values (a run
per 20 records): ANALYZE samples 30,000 rows, and from them it guessed 37,000 runs in a
journal of 52,000,000 records from a million runs, so 1,400 records per run. Planned on
that guess, the admin's read of a page's wait records cost enough to be JIT-compiled (3 ms
of compiling for a 1 ms read), and any read of a few runs' journals looked like a large one.

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


RUNS_PER_RECORD = -0.05  # n_distinct: negative, a fraction of the rows


def journal_run_ids_are_many(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE durable_agents_journalentry ALTER COLUMN run_id "
            f"SET (n_distinct = {RUNS_PER_RECORD})"
        )


def journal_run_ids_as_sampled(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE durable_agents_journalentry ALTER COLUMN run_id RESET (n_distinct)"
        )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("durable_agents", "0016_prune_tombstones"),
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
        migrations.RunPython(journal_run_ids_are_many, journal_run_ids_as_sampled),
    ]
