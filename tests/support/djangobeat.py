"""The example project's Celery app as the Django process tests run it under ``celery beat``.

It is ``proj``'s own app, configured from the environment as in production,
plus two test hooks: every publish is recorded to Redis from
``after_task_publish`` (the message is with the broker by then), and with
``ZKBEAT_TEST_KILL_AFTER`` set to an entry name the process SIGKILLs itself
right after publishing that entry, the worst moment for a one-off.
"""

from __future__ import annotations

import json
import os
import signal
import time

import redis
from celery.signals import after_task_publish
from proj.celery import app

__all__ = ["app"]

app.conf.beat_max_loop_interval = float(os.environ.get("ZKBEAT_TEST_MAX_INTERVAL", "1"))

_recorder = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])
RECORD_KEY = os.environ["ZKBEAT_TEST_RECORD_KEY"]
KILL_AFTER = os.environ.get("ZKBEAT_TEST_KILL_AFTER")


@after_task_publish.connect
def _record_publish(headers=None, **kwargs) -> None:
    headers = headers or {}
    entry = headers.get("zkbeat-entry")
    _recorder.rpush(
        RECORD_KEY,
        json.dumps(
            {
                "entry": entry,
                "slot": headers.get("zkbeat-slot"),
                "epoch": headers.get("zkbeat-epoch"),
                "task_id": headers.get("id"),
                "pid": os.getpid(),
                "identity": os.environ.get("ZKBEAT_IDENTITY"),
                "at": time.time(),
            }
        ),
    )
    if KILL_AFTER and entry == KILL_AFTER:
        os.kill(os.getpid(), signal.SIGKILL)
