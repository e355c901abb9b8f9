"""Notify only the runs someone follows (PostgreSQL; docs/events.md, issue 17).

PostgreSQL serialises the commits of transactions that sent a ``NOTIFY`` (a cluster-wide
lock held until the commit is flushed), so concurrent writers could not share a WAL flush:
with a notification on every journal insert, 8 connections wrote about a tenth of what they
wrote without. ``Follower`` rows say who follows which run (``durable_agents.database.followers``);
the journal's chain trigger (0009) and the run-status trigger (0006) now notify only when
the run has an unexpired follower — one index probe, and no notification, hence no
serialised commit, for the runs nobody watches. Same channel, same payloads.

Existing databases upgrade in place (``CREATE OR REPLACE`` of both trigger functions; the
triggers themselves are unchanged). Other databases poll and have no trigger. Reversible:
the reverse restores 0009's chain function and 0006's status function.
"""

import importlib

from django.db import migrations, models

J = "durable_agents_journalentry"

# The probe both triggers run. ``now()`` is the writing transaction's start: a long
# transaction counts a just-expired follower as alive (one notification too many), never
# the other way round.
FOLLOWED = (
    "EXISTS (SELECT 1 FROM durable_agents_follower "
    "WHERE run_id = NEW.run_id AND expires_at > now())"
)

PG_CHAIN = f"""
CREATE OR REPLACE FUNCTION durable_agents_journal_chain() RETURNS trigger
LANGUAGE plpgsql AS $body$
DECLARE
    prev text;
BEGIN
    -- One writer per run at a time (the driver, a decision, a signal): the lock is held to
    -- commit, so the record read below is the last committed one, and the seq taken after
    -- it orders the run's records as the chain does. A follower that registers takes this
    -- lock once too, to wait for a writer that probed before its registration committed.
    PERFORM pg_advisory_xact_lock(1684107620, hashtext(NEW.run_id));
    NEW.seq := nextval('{{sequence}}');
    SELECT hash INTO prev FROM durable_agents_journalentry
        WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1;
    NEW.hash := encode(sha256(
        convert_to(coalesce(prev, ''), 'UTF8') || '\\x00'::bytea
        || convert_to(NEW.name, 'UTF8') || '\\x00'::bytea
        || convert_to(encode(sha256(convert_to(NEW.data, 'UTF8')), 'hex'), 'UTF8')), 'hex');
    -- Followers of the run (docs/events.md), told when this transaction commits; nobody
    -- is told of an unfollowed run, whose commit then does not wait on other notifiers.
    IF {FOLLOWED} THEN
        PERFORM pg_notify('da_run_' || md5(NEW.run_id), NEW.seq || ' ' || NEW.run_id);
    END IF;
    RETURN NEW;
END
$body$;
"""

PG_STATUS = f"""
CREATE OR REPLACE FUNCTION durable_agents_status_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF {FOLLOWED} THEN
        PERFORM pg_notify('da_run_' || md5(NEW.run_id), '0 ' || NEW.run_id);
    END IF;
    RETURN NULL;
END $$
"""


def _sequence(cursor):
    cursor.execute(f"SELECT pg_get_serial_sequence('{J}', 'seq')")
    return cursor.fetchone()[0]


def install(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(PG_CHAIN.replace("{sequence}", _sequence(cursor)))
        cursor.execute(PG_STATUS)


def restore(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    notify = importlib.import_module("durable_agents.migrations.0006_journal_notify")
    chain = importlib.import_module("durable_agents.migrations.0009_journal_notify_in_chain_trigger")
    with connection.cursor() as cursor:
        cursor.execute(chain.PG_FUNCTION.replace("{sequence}", _sequence(cursor)))
        cursor.execute(notify.INSTALL[2])  # the status function


class Migration(migrations.Migration):
    dependencies = [("durable_agents", "0009_journal_notify_in_chain_trigger")]

    operations = [
        migrations.CreateModel(
            name="Follower",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("run_id", models.CharField(max_length=400)),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "indexes": [
                    models.Index(fields=["run_id"], name="da_follower_run"),
                    models.Index(fields=["expires_at"], name="da_follower_expiry"),
                ],
            },
        ),
        migrations.RunPython(install, restore, elidable=False),
    ]
