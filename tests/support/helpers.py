"""Small helpers shared by tests.  Tests poll for conditions; they never sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from celery.signals import after_task_publish

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10,
    interval: float = 0.02,
    message: str | Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError with ``message`` (a string, or a callable evaluated
    at failure time so it can describe the latest state) after ``timeout``
    seconds.  Exceptions raised by the predicate propagate immediately.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            what = text or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s: {what}")
        time.sleep(interval)


class Published:
    """Messages handed to the broker by this process (after_task_publish)."""

    def __init__(self) -> None:
        self.headers: list[dict] = []
        after_task_publish.connect(self._record, weak=False)

    def _record(self, headers=None, **kwargs) -> None:
        self.headers.append(dict(headers or {}))

    def entries(self) -> list[str]:
        return [h.get("zkbeat-entry") for h in self.headers]

    def close(self) -> None:
        after_task_publish.disconnect(self._record)


def lead(scheduler: Any, timeout: float = 15) -> None:
    """Wait until an in-process zkbeat scheduler leads."""
    assert scheduler.election.wait_for_leadership(timeout=timeout), "never became leader"
