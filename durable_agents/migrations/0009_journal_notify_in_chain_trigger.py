"""One trigger per journal insert instead of two (PostgreSQL; docs/benchmarks.md).

The audit chain's BEFORE INSERT trigger (0007) now also sends the record's notification
(0006's AFTER INSERT trigger, dropped here): one plpgsql call per record instead of two,
about a third of the server's work for a record of ~1 KB. Same channel, same payload; the
notification is still delivered only when the writing transaction commits. One difference:
a row an ``ON CONFLICT DO NOTHING`` insert then skips (its name was already recorded, by a
racing writer) was announced too — a listener reads the journal after the last seq it has
and finds nothing new, the cost of one read on a race. The run-status trigger is unchanged.

Other databases have no trigger to change. Reversible: the reverse restores 0006's trigger
and 0007's function.
"""

import importlib

from django.db import migrations

J = "durable_agents_journalentry"

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION durable_agents_journal_chain() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    prev text;
BEGIN
    -- One writer per run at a time (the driver, a decision, a signal): the lock is held to
    -- commit, so the record read below is the last committed one, and the seq taken after
    -- it orders the run's records as the chain does.
    PERFORM pg_advisory_xact_lock(1684107620, hashtext(NEW.run_id));
    NEW.seq := nextval('{sequence}');
    SELECT hash INTO prev FROM durable_agents_journalentry
        WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1;
    NEW.hash := encode(sha256(
        convert_to(coalesce(prev, ''), 'UTF8') || '\\x00'::bytea
        || convert_to(NEW.name, 'UTF8') || '\\x00'::bytea
        || convert_to(encode(sha256(convert_to(NEW.data, 'UTF8')), 'hex'), 'UTF8')), 'hex');
    -- Listeners of the run (docs/events.md), told when this transaction commits.
    PERFORM pg_notify('da_run_' || md5(NEW.run_id), NEW.seq || ' ' || NEW.run_id);
    RETURN NEW;
END
$body$;
"""


def _sequence(cursor):
    cursor.execute(f"SELECT pg_get_serial_sequence('{J}', 'seq')")
    return cursor.fetchone()[0]


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(PG_FUNCTION.replace("{sequence}", _sequence(cursor)))
        cursor.execute(f"DROP TRIGGER IF EXISTS durable_agents_journal_notify ON {J}")
        cursor.execute("DROP FUNCTION IF EXISTS durable_agents_journal_notify()")


def restore(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    notify = importlib.import_module("durable_agents.migrations.0006_journal_notify")
    chain = importlib.import_module("durable_agents.migrations.0007_audit_chain")
    with connection.cursor() as cursor:
        cursor.execute(chain.PG_FUNCTION.replace("{sequence}", _sequence(cursor)))
        for statement in notify.INSTALL[:2]:  # the journal's function and trigger
            cursor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("durable_agents", "0008_run_saga_statuses")]

    operations = [migrations.RunPython(install, restore, elidable=False)]
