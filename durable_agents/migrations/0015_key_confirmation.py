"""A key registered for someone else takes effect only once its owner confirms it.

``ApiKey`` and ``ApproverKey`` gain ``confirmed_at`` (null: pending, the key authenticates or
verifies nothing). Keys that exist already are confirmed as of their creation: they worked
before this migration and keep working; review the ones whose ``created_by`` is not their
``user`` (docs/admin.md). ``KeyChallenge`` holds the single-use challenges an approver signs
to confirm a key registered for them.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


def confirm_existing_keys(apps, schema_editor):
    for name in ("ApiKey", "ApproverKey"):
        model = apps.get_model("durable_agents", name)
        model.objects.filter(confirmed_at__isnull=True).update(confirmed_at=models.F("created_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('durable_agents', '0014_imported_runs'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='confirmed_at',
            field=models.DateTimeField(blank=True, help_text='when its owner confirmed it; empty: pending, it authenticates nothing', null=True),
        ),
        migrations.AddField(
            model_name='approverkey',
            name='confirmed_at',
            field=models.DateTimeField(blank=True, help_text='when its owner proved they hold the private key; empty: pending, it verifies nothing', null=True),
        ),
        migrations.RunPython(confirm_existing_keys, migrations.RunPython.noop),
        migrations.CreateModel(
            name='KeyChallenge',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('nonce', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('expires_at', models.DateTimeField()),
                ('used_at', models.DateTimeField(blank=True, null=True)),
                ('key', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='challenges', to='durable_agents.approverkey')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
        ),
    ]
