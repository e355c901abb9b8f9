from django.contrib.auth.models import AbstractUser


class Person(AbstractUser):
    """A user model other than ``auth.User``, on a table of its own."""

    class Meta:
        app_label = "swapped_user"
