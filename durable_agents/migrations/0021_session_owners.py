"""Session owners (issue 41, docs/sessions.md "Who a session belongs to"): a session takes
messages only from the agent and the channel that opened it. The agent is already on each
session journal's row; this gives every session opened before it a channel, from what its
rows show:

* the API logged a message to it (``send``/``send_once`` through an API key or a staff
  login): ``api``;
* otherwise a delivery (``event:``) is in its journal: ``webhook``, the channel of a
  webhook view on the default secret;
* otherwise: ``site``, the site's own code.

A site that ran several webhook views gives the others' old sessions to their channel with
``durable_agents session-channel`` (docs/sessions.md).
"""

from django.db import migrations

BATCH = 1000


def give_owners(apps, schema_editor):
    db = schema_editor.connection.alias
    run = apps.get_model("durable_agents", "Run")
    entry = apps.get_model("durable_agents", "JournalEntry")
    action = apps.get_model("durable_agents", "ActionLog")
    rows = run.objects.using(db).filter(kind="session").order_by("pk")
    last = ""
    while True:
        batch = list(rows.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        last = batch[-1].pk
        sessions = {r.session_id for r in batch if r.session_id}
        via_api = set(
            action.objects.using(db)
            .filter(action__in=("send", "send_once"), target__in=sessions)
            .exclude(channel="python")
            .exclude(channel="")
            .values_list("target", flat=True)
        )
        delivered = set(
            entry.objects.using(db)
            .filter(run_id__in=[r.pk for r in batch], name__startswith="event:")
            .values_list("run_id", flat=True)
            .distinct()
        )
        changed = []
        for r in batch:
            body = r.input if isinstance(r.input, dict) else {}
            if body.get("channel"):
                continue
            if r.session_id in via_api:
                channel = "api"
            elif r.pk in delivered:
                channel = "webhook"
            else:
                channel = "site"
            r.input = {**body, "session": r.session_id, "channel": channel}
            changed.append(r)
        run.objects.using(db).bulk_update(changed, ["input"])


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agents", "0020_spent_ids"),
    ]

    operations = [
        migrations.RunPython(give_owners, migrations.RunPython.noop),
    ]
