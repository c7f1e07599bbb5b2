"""An unmanaged model with no table: it only gives the cluster page a place on the admin index.

The admin lists what is registered per app; registering ``Cluster`` puts a
"Cluster" link under "zkbeat" there, and its admin's change list is the
cluster page (zkbeat.contrib.admin.admin.ClusterAdmin). No migration, no table.
"""

from __future__ import annotations

from django.db import models

from .apps import require_django_celery_beat

require_django_celery_beat()


class Cluster(models.Model):
    """The zkbeat cluster the project's Celery app belongs to (read from ZooKeeper, never stored)."""

    class Meta:
        managed = False
        verbose_name = "cluster"
        verbose_name_plural = "cluster"
        default_permissions = ()
