"""What the broker side received: each message taken off a Redis queue, as a worker would, and when.

The record of tests/support/processes.py is kept by the publishers
themselves (``after_task_publish``). This reader is the other end: it pops
every message off the broker's queue and keeps its headers with the moment
it had it, so a test can check what arrived, and when, without trusting the
sender. A message cannot be taken off before it was sent, so that moment is
never earlier than the publish.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime

import redis

__all__ = ["Message", "QueueReader"]


@dataclass(frozen=True)
class Message:
    headers: dict
    #: time.time() when the message was taken off the queue.
    seen_at: float

    @property
    def entry(self) -> str | None:
        return self.headers.get("zkbeat-entry")

    @property
    def slot(self) -> datetime:
        return datetime.fromisoformat(self.headers["zkbeat-slot"])

    @property
    def epoch(self) -> int | None:
        return self.headers.get("zkbeat-epoch")


class QueueReader:
    """Pops every message of ``queue`` on the Redis broker at ``url`` in a thread of its own; ``close()`` stops it."""

    def __init__(self, url: str, queue: str = "celery") -> None:
        self._client = redis.Redis.from_url(url)
        self._queue = queue
        self._lock = threading.Lock()
        self._messages: list[Message] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"queue-reader-{queue}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._client.brpop([self._queue], timeout=0.2)  # as kombu takes them: oldest first
            if item is None:
                continue
            seen_at = time.time()
            envelope = json.loads(item[1])
            with self._lock:
                self._messages.append(Message(dict(envelope.get("headers") or {}), seen_at))

    def messages(self) -> list[Message]:
        """What was taken so far, in the order it was taken."""
        with self._lock:
            return list(self._messages)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()
