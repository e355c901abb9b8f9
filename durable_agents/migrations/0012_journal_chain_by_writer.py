"""The driver hashes its own records; the chain trigger is for everyone else (PostgreSQL;
docs/audit.md, issue 18).

The chain trigger (0007, 0009, 0010) cost every journal insert a plpgsql call, an advisory
lock, a read of the run's last record and two hashes: about a fifth of a fenced insert. A
driver already knows its run's last record — it wrote it — so it now sends the record's
hash and its predecessor's ``seq`` (``prev_seq``) with the insert, and the trigger fires
only for rows that come without a hash (``WHEN (NEW.hash IS NULL)``): a staff decision, a
signal, an import, a driver's first write after taking a lease, or code older than this
migration.

What keeps the chain a chain without the trigger's lock is the new unique index on
``prev_seq``: a record is the predecessor of at most one record, so two writers that both
believe the same record is the last cannot both succeed. The loser's statement fails whole,
and the store writes its record again through the trigger, which reads the true last
record. The trigger now sets ``prev_seq`` too, so writers of both kinds are checked against
each other; the store's own trigger-hashed inserts first wait for the records being hashed
by their writers, so they are never the loser. ``prev_seq`` is not hashed: the chain's
definition and verification are unchanged, and rows written before this migration keep a
null ``prev_seq``.

During a rolling deploy, a record written by code older than this migration (a staff
decision on a web server not yet updated) at the same moment as a new driver's record of
the same run can be refused with an ``IntegrityError`` on ``da_journal_prev_seq``: nothing
is written, and writing it again succeeds.

The unique index is built in this migration (not concurrently): on PostgreSQL that scans
the journal once and holds writes to it meanwhile; every existing row has a null
``prev_seq``, so nothing can conflict.

SQLite keeps its trigger as it was (its writers are serialised by the database lock; the
store never sends a hash there) and gets the column and the index. Reversible: the reverse
restores 0010's function and the trigger without its condition, then drops the index and
the column.
"""

import importlib

from django.db import migrations, models

J = "durable_agents_journalentry"

# 0010's function, which also records the predecessor's seq.
PG_CHAIN = """
CREATE OR REPLACE FUNCTION durable_agents_journal_chain() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    prev text;
    prev_seq bigint;
BEGIN
    -- One writer per run at a time (the driver, a decision, a signal): the lock is held to
    -- commit, so the record read below is the last committed one, and the seq taken after
    -- it orders the run's records as the chain does. The store's statements have already
    -- waited for the records their writers hashed (they lock the run's lease row first,
    -- ``storage._LEASE_WAIT``). A follower that registers takes this lock once too, to
    -- wait for a writer that probed before its registration committed.
    PERFORM pg_advisory_xact_lock(1684107620, hashtext(NEW.run_id));
    NEW.seq := nextval('{sequence}');
    SELECT hash, seq INTO prev, prev_seq FROM durable_agents_journalentry
        WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1;
    NEW.prev_seq := prev_seq;
    NEW.hash := encode(sha256(
        convert_to(coalesce(prev, ''), 'UTF8') || '\\x00'::bytea
        || convert_to(NEW.name, 'UTF8') || '\\x00'::bytea
        || convert_to(encode(sha256(convert_to(NEW.data, 'UTF8')), 'hex'), 'UTF8')), 'hex');
    -- Followers of the run (docs/events.md), told when this transaction commits; nobody
    -- is told of an unfollowed run, whose commit then does not wait on other notifiers.
    IF {followed} THEN
        PERFORM pg_notify('da_run_' || md5(NEW.run_id), NEW.seq || ' ' || NEW.run_id);
    END IF;
    RETURN NEW;
END
$body$;
"""

TRIGGER = (
    f"DROP TRIGGER IF EXISTS durable_agents_journal_chain ON {J}; "
    f"CREATE TRIGGER durable_agents_journal_chain BEFORE INSERT ON {J} FOR EACH ROW {{when}}"
    "EXECUTE FUNCTION durable_agents_journal_chain()"
)


def _previous():
    return importlib.import_module("durable_agents.migrations.0010_notify_only_followed_runs")


def _sqlite_trigger(schema_editor):
    """SQLite rebuilds the table to add a constraint or drop a column, and its triggers go
    with the old table: 0007's is put back (after this migration, and after its reverse)."""
    connection = schema_editor.connection
    if connection.vendor == "sqlite":
        chain = importlib.import_module("durable_agents.migrations.0007_audit_chain")
        with connection.cursor() as cursor:
            cursor.execute(chain.SQLITE_TRIGGER)


def sqlite_trigger(apps, schema_editor):
    _sqlite_trigger(schema_editor)


def install(apps, schema_editor):
    connection = schema_editor.connection
    _sqlite_trigger(schema_editor)
    if connection.vendor != "postgresql":
        return
    previous = _previous()
    with connection.cursor() as cursor:
        sequence = previous._sequence(cursor)
        cursor.execute(
            PG_CHAIN.replace("{sequence}", sequence).replace("{followed}", previous.FOLLOWED)
        )
        cursor.execute(TRIGGER.format(when="WHEN (NEW.hash IS NULL) "))


def restore(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    previous = _previous()
    with connection.cursor() as cursor:
        cursor.execute(previous.PG_CHAIN.replace("{sequence}", previous._sequence(cursor)))
        cursor.execute(TRIGGER.format(when=""))


class Migration(migrations.Migration):
    dependencies = [("durable_agents", "0011_lease_without_constraint_no_pattern_indexes")]

    operations = [
        # Its reverse runs last: the trigger again after the reverse's table rebuilds.
        migrations.RunPython(migrations.RunPython.noop, sqlite_trigger, elidable=False),
        migrations.AddField(
            model_name="journalentry",
            name="prev_seq",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddConstraint(
            model_name="journalentry",
            constraint=models.UniqueConstraint(fields=["prev_seq"], name="da_journal_prev_seq"),
        ),
        migrations.RunPython(install, restore, elidable=False),
    ]
