"""A flag one thread waits on and others set: threading.Event's interface, waited on with a pipe.

A sharded replica's beat loop sleeps until its next entry is due, woken at
once when any shard's election changes hands or a run-now request comes for
a shard it leads: one wait, not a poll of every shard. ``threading.Event``
cannot be that wait: in a process whose clocks are shifted (libfaketime, as
the clock-skew tests run replicas) a timed ``Event.wait`` that nobody sets
never returns. A ``select`` on a pipe with a timeout does return, so the
wait here is one of those.
"""

from __future__ import annotations

import os
import selectors
import threading

__all__ = ["Wakeup"]


class Wakeup:
    """``set``/``clear``/``is_set``/``wait`` as threading.Event; :meth:`wait` is for one thread at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flag = False
        self._closed = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._read, selectors.EVENT_READ)

    def set(self) -> None:
        """Raise the flag and wake the waiter (any thread, e.g. a ZooKeeper watch's)."""
        with self._lock:
            if self._flag or self._closed:
                return
            self._flag = True
            try:
                os.write(self._write, b"x")
            except BlockingIOError:  # the pipe is full: the waiter wakes anyway
                pass

    def clear(self) -> None:
        with self._lock:
            self._flag = False
            if self._closed:
                return
            try:
                while os.read(self._read, 4096):
                    pass
            except BlockingIOError:
                pass

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` seconds pass; returns the flag."""
        if self._flag or self._closed:
            return self._flag
        try:
            self._selector.select(timeout)
        except (OSError, ValueError):  # closed meanwhile (by another thread): the wait is over
            pass
        return self._flag

    def close(self) -> None:
        """Free the pipe; set() does nothing afterwards and wait() returns at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                os.write(self._write, b"x")  # a waiter's select returns before its selector goes
            except BlockingIOError:
                pass
            self._selector.close()
            os.close(self._read)
            os.close(self._write)
