"""The audit hash chains (docs/audit.md).

Journal records are hashed by the database in the statement that inserts them: a BEFORE
INSERT trigger on PostgreSQL, an AFTER INSERT trigger calling a SQL function that each
SQLite connection registers (``durable_agents.database.audit``) on SQLite. Rows written before this
migration keep a null hash: each run's unchained prefix.
"""

from django.db import migrations, models

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
    RETURN NEW;
END
$body$;
DROP TRIGGER IF EXISTS durable_agents_journal_chain ON durable_agents_journalentry;
CREATE TRIGGER durable_agents_journal_chain BEFORE INSERT ON durable_agents_journalentry
    FOR EACH ROW EXECUTE FUNCTION durable_agents_journal_chain();
"""

# SQLite cannot change NEW in a trigger: the row is hashed just after its insert, in the
# same statement. ``durable_agents_chain_hash`` is registered on every SQLite connection by
# ``durable_agents.database.audit`` (writing a journal without it fails instead of skipping a hash).
SQLITE_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS durable_agents_journal_chain
AFTER INSERT ON durable_agents_journalentry
BEGIN
    UPDATE durable_agents_journalentry SET hash = durable_agents_chain_hash(
        (SELECT hash FROM durable_agents_journalentry
         WHERE run_id = NEW.run_id AND seq < NEW.seq ORDER BY seq DESC LIMIT 1),
        NEW.name, NEW.data)
    WHERE seq = NEW.seq;
END
"""


def create_trigger(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_serial_sequence('durable_agents_journalentry', 'seq')")
            (sequence,) = cursor.fetchone()
            cursor.execute(PG_FUNCTION.replace("{sequence}", sequence))
    elif connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(SQLITE_TRIGGER)


def drop_trigger(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "DROP TRIGGER IF EXISTS durable_agents_journal_chain ON durable_agents_journalentry"
            )
            cursor.execute("DROP FUNCTION IF EXISTS durable_agents_journal_chain()")
        elif connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER IF EXISTS durable_agents_journal_chain")


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agents", "0006_journal_notify"),
    ]

    operations = [
        migrations.AddField(
            model_name="actionlog",
            name="hash",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="journalentry",
            name="hash",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        migrations.RunPython(create_trigger, drop_trigger),
    ]
