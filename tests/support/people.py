"""The site's people in tests: users holding exactly the permissions a test gives them."""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission, User


def perm(name: str) -> Permission:
    """``"app.codename"``, or a codename of durable_agents."""
    app, code = name.split(".") if "." in name else ("durable_agents", name)
    return Permission.objects.get(content_type__app_label=app, codename=code)


def make_user(
    name: str,
    *perms: str,
    staff: bool = True,
    superuser: bool = False,
    groups: tuple[str, ...] = (),
    password: str | None = None,
) -> User:
    """A user holding exactly ``perms`` (see ``perm``), a member of ``groups`` (created when
    missing). Without a password it cannot log in by form: tests use ``force_login``."""
    user = User.objects.create_user(name, password=password, is_staff=staff, is_superuser=superuser)
    user.user_permissions.add(*(perm(p) for p in perms))
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return User.objects.get(pk=user.pk)  # a fresh object: no cached permissions
