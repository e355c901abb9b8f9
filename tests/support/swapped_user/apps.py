from django.apps import AppConfig


class SwappedUserConfig(AppConfig):
    name = "tests.support.swapped_user"
    label = "swapped_user"
    default_auto_field = "django.db.models.BigAutoField"
