"""Keys belong to people, and the action log says how each action came.

* ``ApproverKey.approver`` (a free-text name) becomes ``ApproverKey.user``, a foreign key to
  the user model. Existing rows are tied to the user who has that username; a row naming no
  user is deleted (it could never be bound to a person). ``public_key`` becomes unique: a
  key registered to more than one user is deleted everywhere (nobody can tell whose it is),
  and one registered twice to the same user keeps its oldest row.
* ``ApiKey`` gains ``expires_at`` and ``created_by``; ``ApproverKey`` gains ``created_by``.
* ``ActionLog`` gains ``actor_id`` (the user's primary key) and ``channel``.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def bind_approver_keys(apps, schema_editor):
    app_label, model_name = settings.AUTH_USER_MODEL.split(".")
    User = apps.get_model(app_label, model_name)
    ApproverKey = apps.get_model("durable_agents", "ApproverKey")
    db = schema_editor.connection.alias
    field = getattr(User, "USERNAME_FIELD", "username")
    for key in ApproverKey.objects.using(db).order_by("created_at", "id"):
        user = User._default_manager.using(db).filter(**{field: key.approver}).first()
        if user is None:
            key.delete(using=db)
            continue
        key.user_id = user.pk
        key.save(using=db, update_fields=["user"])
    owners = {}
    for key in ApproverKey.objects.using(db).order_by("created_at", "id"):
        owners.setdefault(key.public_key, []).append(key)
    for keys in owners.values():
        if len({k.user_id for k in keys}) > 1:
            for k in keys:
                k.delete(using=db)
        else:
            for k in keys[1:]:
                k.delete(using=db)


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("durable_agents", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="approverkey",
            name="user",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="durable_agents_approver_keys",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(bind_approver_keys, migrations.RunPython.noop),
        migrations.RemoveField(model_name="approverkey", name="approver"),
        migrations.AlterField(
            model_name="approverkey",
            name="user",
            field=models.ForeignKey(
                help_text="the approver: decisions signed with this key are theirs",
                on_delete=django.db.models.deletion.CASCADE,
                related_name="durable_agents_approver_keys",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="approverkey",
            name="public_key",
            field=models.CharField(
                help_text="raw 32-byte Ed25519 public key, base64", max_length=100, unique=True
            ),
        ),
        migrations.AddField(
            model_name="approverkey",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                help_text="who registered the key (its owner, or a superuser)",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                help_text="who created the key (its owner, or a superuser)",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="expires_at",
            field=models.DateTimeField(
                blank=True,
                help_text="refused from this moment on; empty: never expires",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="actionlog",
            name="actor_id",
            field=models.CharField(
                blank=True, default="", help_text="the user's primary key (stable)", max_length=64
            ),
        ),
        migrations.AddField(
            model_name="actionlog",
            name="channel",
            field=models.CharField(
                blank=True,
                default="",
                help_text="how the request came: admin, session, api-key:<prefix>, signature "
                "via <relay>, command, python",
                max_length=300,
            ),
        ),
    ]
