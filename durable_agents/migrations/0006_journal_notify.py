"""Every journal insert, and every change of a run's status, notifies listeners of that run
(PostgreSQL ``LISTEN``/``NOTIFY``; ``durable_agents.database.events``). A trigger, not a change to the
insert statements: whoever writes the journal, and however, listeners hear of it.

The channel is ``da_run_`` and the MD5 (hex) of the run id (run ids are longer than a
channel name may be); the payload is the record's ``seq``, a space, and the run id (``0``
for a status change). The notification is sent when the transaction commits, so a listener
that hears it can read the row. Other databases poll and need nothing here.
"""

from django.db import migrations

JOURNAL = "durable_agents_journalentry"
RUN = "durable_agents_run"

INSTALL = [
    """CREATE OR REPLACE FUNCTION durable_agents_journal_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('da_run_' || md5(NEW.run_id), NEW.seq || ' ' || NEW.run_id);
        RETURN NULL;
    END $$""",
    f"""CREATE TRIGGER durable_agents_journal_notify AFTER INSERT ON {JOURNAL}
    FOR EACH ROW EXECUTE FUNCTION durable_agents_journal_notify()""",
    """CREATE OR REPLACE FUNCTION durable_agents_status_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('da_run_' || md5(NEW.run_id), '0 ' || NEW.run_id);
        RETURN NULL;
    END $$""",
    f"""CREATE TRIGGER durable_agents_status_notify AFTER UPDATE OF status ON {RUN}
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION durable_agents_status_notify()""",
]

REMOVE = [
    f"DROP TRIGGER IF EXISTS durable_agents_status_notify ON {RUN}",
    "DROP FUNCTION IF EXISTS durable_agents_status_notify()",
    f"DROP TRIGGER IF EXISTS durable_agents_journal_notify ON {JOURNAL}",
    "DROP FUNCTION IF EXISTS durable_agents_journal_notify()",
]


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in INSTALL:
            schema_editor.execute(statement)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in REMOVE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("durable_agents", "0005_decision_arguments")]

    operations = [migrations.RunPython(install, remove, elidable=False)]
