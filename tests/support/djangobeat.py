"""The example project's Celery app as the Django process tests run it under ``celery beat``.

It is ``proj``'s own app, configured from the environment as in production,
plus two test hooks: every publish is recorded to Redis from
``after_task_publish`` (the message is with the broker by then), and with
``ZKBEAT_TEST_KILL_AFTER`` set to an entry name the process SIGKILLs itself
right after publishing that entry, the worst moment for a one-off.
"""

from __future__ import annotations

import os
import signal

from celery.signals import after_task_publish
from proj.celery import app

from tests.support.processes import record_publishes

__all__ = ["app"]

app.conf.beat_max_loop_interval = float(os.environ.get("ZKBEAT_TEST_MAX_INTERVAL", "1"))
if os.environ.get("ZKBEAT_TEST_SHARDS"):
    app.conf.zkbeat_shards = int(os.environ["ZKBEAT_TEST_SHARDS"])

# The record lives in Redis even when the broker is RabbitMQ (or is down).
record_publishes(
    os.environ.get("ZKBEAT_TEST_RECORD_URL") or os.environ["CELERY_BROKER_URL"],
    os.environ["ZKBEAT_TEST_RECORD_KEY"],
    os.environ.get("ZKBEAT_IDENTITY"),
)
KILL_AFTER = os.environ.get("ZKBEAT_TEST_KILL_AFTER")


@after_task_publish.connect
def _kill_after(headers=None, **kwargs) -> None:
    """Test hook: die the moment the one-off named by ZKBEAT_TEST_KILL_AFTER is with the broker."""
    if KILL_AFTER and (headers or {}).get("zkbeat-entry") == KILL_AFTER:
        os.kill(os.getpid(), signal.SIGKILL)
