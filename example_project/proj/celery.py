"""The Celery app, configured from Django settings (``CELERY_*``, ``CELERY_ZKBEAT_*``).

celery -A proj worker
celery -A proj beat --scheduler zkbeat.DatabaseScheduler   # on 1, 3 or 10 replicas
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
