"""Where a run was started from, as W3C trace context (issue 34, docs/telemetry.md): one row
per run, written only with ``DURABLE_AGENTS["TELEMETRY"]`` on."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable_agents", "0018_limits"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunTrace",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="durable_agents.run",
                    ),
                ),
                ("traceparent", models.CharField(max_length=55)),
                ("tracestate", models.CharField(blank=True, default="", max_length=512)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
        ),
    ]
