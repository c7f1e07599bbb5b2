"""What the in-process tests read of the messages zkbeat writes: the queue in Redis, and the messages of a shape.

The tests of the batch path read the queue in Redis itself (past any proxy),
not what ``after_task_publish`` was told; and they compare each message made
from a task's shape with the one kombu writes for the same tick.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
import redis

from zkbeat.leading import batch_publish
from zkbeat.ticking.ticks import task_id_for


def queued_messages(port: int, queue: str = "celery*") -> list[dict]:
    """Every message in the Redis lists named like ``queue`` (by default, the default queue and each of its
    priority lists), list by list in name order, oldest first within each."""
    client = redis.Redis(port=port)
    try:
        raw = [item for key in sorted(client.keys(queue)) for item in reversed(client.lrange(key, 0, -1))]
    finally:
        client.close()
    return [json.loads(item) for item in raw]


def compare_shaped_messages(monkeypatch: pytest.MonkeyPatch, root: Callable[[], str]) -> list[str]:
    """Check every message made from a shape against the one kombu writes; returns the entries compared.

    Each first message the batch path makes from a shape (its template) is
    compared, command for command, with what kombu writes on the same channel
    for the same entry, task id, slot and delivery tag; a difference fails the
    pass with the entry's name. ``root`` gives the scheduler's root (read
    when a message is made, so the scheduler can be built afterwards).
    """
    compared: list[str] = []
    from_shape = batch_publish.BatchSender._from_shape

    def checked(self, entry, body, extra, channel):
        template = from_shape(self, entry, body, extra, channel)
        if template is not None:
            task_id = task_id_for(root(), entry.name, datetime.now(timezone.utc))
            headers, properties = self._patched(body, task_id, extra)
            message = channel.prepare_message(
                body.data, body.shape.priority, body.content_type, body.content_encoding, headers, properties
            )
            kombus = self._record(channel, message, body.shape)
            tag = message["properties"]["delivery_tag"]
            assert template.commands(task_id, extra["zkbeat-slot"], tag) == kombus, entry.name
            compared.append(entry.name)
        return template

    monkeypatch.setattr(batch_publish.BatchSender, "_from_shape", checked)
    return compared
