"""Cheaper run and lease writes (PostgreSQL; issue 17).

* The lease's foreign key to its run loses its database constraint. Every statement that
  writes a lease already requires its run (``storage.py``), and the constraint's check at
  commit locked the run row (``FOR KEY SHARE``) on every lease taken. Deleting a run still
  deletes its lease (Django's ``on_delete``).
* The ``varchar_pattern_ops`` indexes Django adds beside a ``CharField`` key or index
  (``…_like``) go: they serve only ``LIKE 'prefix%'``, which nothing here asks (the admin
  searches with ``icontains``), and every run inserted or finished paid for them.

Reversible: the reverse puts both back. Other databases: the constraint goes (SQLite), the
indexes never existed.
"""

import django.db.models.deletion
from django.db import migrations, models

# (model, column) of each pattern index dropped.
PATTERN_INDEXES = [("run", "run_id"), ("run", "session_id"), ("lease", "run_id")]


def _names(apps, schema_editor):
    for model_name, column in PATTERN_INDEXES:
        table = apps.get_model("durable_agents", model_name)._meta.db_table
        yield table, column, schema_editor._create_index_name(table, [column], suffix="_like")


def drop_pattern_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for _, _, name in _names(apps, schema_editor):
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def restore_pattern_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    for table, column, name in _names(apps, schema_editor):
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {q(name)} ON {q(table)} ({q(column)} varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [("durable_agents", "0010_notify_only_followed_runs")]

    operations = [
        migrations.AlterField(
            model_name="lease",
            name="run",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                serialize=False,
                to="durable_agents.run",
            ),
        ),
        migrations.RunPython(drop_pattern_indexes, restore_pattern_indexes, elidable=False),
    ]
