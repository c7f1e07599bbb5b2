"""The example project: Django + Celery + django-celery-beat, with beat run by zkbeat."""

from .celery import app as celery_app

__all__ = ("celery_app",)
