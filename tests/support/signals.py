"""A SIGTERM handler for in-process tests: it raises, as celery beat's does, and is put back afterwards."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


class Terminated(BaseException):
    """What SIGTERM raises within :func:`sigterm_raises`: like SystemExit, no ``except Exception`` catches it."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` in the main thread; the handler before is back after."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def close_under_a_second_sigterm(scheduler: Any) -> None:
    """``scheduler.close()``, during which the test raises SIGTERM: the signal goes through, and only at the end.

    The test arranges the signal (raised from inside close(), where it
    wants it to land) and then asserts what close() finished before it.
    """
    with sigterm_raises(), pytest.raises(Terminated):
        scheduler.close()
