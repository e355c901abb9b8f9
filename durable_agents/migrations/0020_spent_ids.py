"""Spent ids (issue 41, ``engine.spent``): a run id this site held and deleted is never
taken again. The ids deleted before this migration are spent from what they left: a
tombstone (pruned) or a ``delete`` row of the action log (deleted), unless a run holds the
id again now."""

import django.db.models.functions.datetime
from django.db import migrations, models


def spend_deleted_ids(apps, schema_editor):
    db = schema_editor.connection.alias
    run = apps.get_model("durable_agents", "Run")
    spent = apps.get_model("durable_agents", "SpentRunId")
    tombstone = apps.get_model("durable_agents", "Tombstone")
    action = apps.get_model("durable_agents", "ActionLog")
    found = {rid: "pruned" for rid in tombstone.objects.using(db).values_list("run_id", flat=True)}
    for rid in action.objects.using(db).filter(action="delete").values_list("run_id", flat=True):
        found.setdefault(rid, "deleted")
    ids = sorted(found)
    for i in range(0, len(ids), 1000):
        batch = ids[i : i + 1000]
        held = set(run.objects.using(db).filter(pk__in=batch).values_list("pk", flat=True))
        spent.objects.using(db).bulk_create(
            [spent(run_id=rid, reason=found[rid]) for rid in batch if rid not in held],
            ignore_conflicts=True,
        )


class Migration(migrations.Migration):

    dependencies = [
        ('durable_agents', '0019_run_trace'),
    ]

    operations = [
        migrations.CreateModel(
            name='SpentDecision',
            fields=[
                ('digest', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('run_id', models.CharField(max_length=400)),
                ('call_id', models.CharField(max_length=500)),
                ('approver', models.CharField(max_length=200)),
                ('spent_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.CreateModel(
            name='SpentRunId',
            fields=[
                ('run_id', models.CharField(max_length=400, primary_key=True, serialize=False)),
                ('reason', models.CharField(max_length=16)),
                ('spent_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.RunPython(spend_deleted_ids, migrations.RunPython.noop),
    ]
