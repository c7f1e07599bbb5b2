"""The app's configuration: its label, the name the admin index shows, and what it needs installed."""

from __future__ import annotations

from django.apps import AppConfig, apps
from django.core.exceptions import ImproperlyConfigured


def require_django_celery_beat() -> None:
    """ImproperlyConfigured, naming the setting, unless django_celery_beat is installed (its admin is extended)."""
    if not apps.is_installed("django_celery_beat"):
        raise ImproperlyConfigured(
            "INSTALLED_APPS: zkbeat.contrib.admin extends django-celery-beat's admin; add 'django_celery_beat' "
            "to INSTALLED_APPS"
        )


class ZkbeatAdminConfig(AppConfig):
    """``zkbeat.contrib.admin``; its admin module (loaded by the admin's autodiscovery) does the rest.

    Its models module checks that django_celery_beat is installed: Django
    imports every app's models before any ``ready()`` and before the admin's
    autodiscovery, which would otherwise fail first, less clearly.
    """

    name = "zkbeat.contrib.admin"
    label = "zkbeat_admin"
    verbose_name = "zkbeat"
    default_auto_field = "django.db.models.AutoField"
