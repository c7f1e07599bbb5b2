"""Bounding a database write in time (PostgreSQL): the write of run times at exit, which holds the exit.

Two bounds, because a hung statement has two causes. One the server knows
of (a lock it waits for, a plan that never ends): each transaction gets
the time left as its ``statement_timeout`` and ``lock_timeout``, local to
it (``SET LOCAL``: the connection's own settings are untouched). One it
does not (the server or the network stopped answering, so its timeouts
never fire): the connection's socket is shut down CUT_OFF_GRACE past the
deadline, and the driver, blocked on it, gets end-of-file at once. A
connection the write must open first (the late write always does) has no
socket to cut yet: it is opened with libpq's ``connect_timeout`` set to
the time left.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from django.db import DatabaseError, Error
from django.db.transaction import TransactionManagementError, atomic

__all__ = ["TIMED_OUT", "OutOfTime", "cut_off", "timed_out", "transaction_until"]

#: SQLSTATEs of a statement PostgreSQL ended at a time limit: query_canceled (statement_timeout), lock_not_available.
TIMED_OUT = {"57014", "55P03"}
#: Seconds past the deadline that a statement may stay unanswered before its connection is cut (server silent).
CUT_OFF_GRACE = 1.0
#: libpq's shortest ``connect_timeout``: it takes whole seconds and reads 1 as 2.
SHORTEST_CONNECT_TIMEOUT = 2


class OutOfTime(DatabaseError):
    """The write outlived its time: its connection was cut, or no time was left for its next chunk."""


class _CutOff:
    """Shuts the connection's socket down at the moment last armed for (monotonic) unless armed again or closed first.

    A server that stopped answering (a dead host, a network that drops
    packets) never ends a statement by its own timeouts; the driver, blocked
    on the socket, then gets end-of-file at once and raises.
    """

    def __init__(self, raw_connection) -> None:
        self._socket = socket.socket(fileno=os.dup(raw_connection.fileno()))  # its own descriptor: never reused
        self._lock = threading.Lock()
        self._closed = False
        self.fired = False
        self._timer: threading.Timer | None = None
        self._armed = 0  # which arming a timer belongs to: one re-armed meanwhile must not fire

    def arm(self, at: float) -> None:
        with self._lock:
            if self._closed or self.fired:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._armed += 1
            self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire, (self._armed,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, armed: int) -> None:
        with self._lock:
            if self._closed or armed != self._armed:
                return
            self.fired = True
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            timer = self._timer
        if timer is not None:
            timer.cancel()
        self._socket.close()


@contextlib.contextmanager
def cut_off(connection, deadline: float | None, stall: float | None = None) -> Iterator[Callable[[], float] | None]:
    """Within the block, cut the connection CUT_OFF_GRACE past its time (no ``deadline``: never).

    Yields ``next_chunk()``, to call before each chunk: it returns the
    chunk's own deadline (``stall`` seconds from now, within ``deadline``)
    and cuts the connection CUT_OFF_GRACE past that one instead.
    """
    if deadline is None:
        yield None
        return

    def chunk_deadline() -> float:
        return deadline if stall is None else min(deadline, time.monotonic() + stall)

    _connect_until(connection, chunk_deadline())
    cut = _CutOff(connection.connection)

    def next_chunk() -> float:
        at = chunk_deadline()
        cut.arm(at + CUT_OFF_GRACE)
        return at

    try:
        next_chunk()  # until the first chunk, too
        yield next_chunk
    except Error as exc:
        if cut.fired:
            raise OutOfTime(f"no answer {CUT_OFF_GRACE:g} s past the time limit: the connection was cut") from exc
        raise
    finally:
        cut.close()
        if cut.fired:  # even as the write's last answer came: its socket is shut down, and no later query may use it
            connection.close()


def _connect_until(connection, deadline: float) -> None:
    """Open the connection unless it is open, waiting for the server about as long as is left until ``deadline``.

    Django opens it without a ``connect_timeout`` (unless the database's
    ``OPTIONS`` give one): a server that accepts the connection and never
    answers, or a dead host, would hold the exit for as long as TCP tries.
    """
    if connection.connection is not None:
        return
    seconds = max(SHORTEST_CONNECT_TIMEOUT, math.ceil(deadline - time.monotonic()))
    own_params = connection.get_connection_params

    def bounded_params() -> dict:
        params = own_params()
        try:
            given = int(params.get("connect_timeout") or 0)
        except (TypeError, ValueError):
            given = 0
        params["connect_timeout"] = min(given, seconds) if given > 0 else seconds
        return params

    started = time.monotonic()
    connection.get_connection_params = bounded_params  # this wrapper only: it belongs to this thread
    try:
        connection.ensure_connection()
    except Error as exc:
        # libpq counts its timeout in whole seconds of the wall clock: up to one early.
        if time.monotonic() - started >= seconds - 1:
            raise OutOfTime(f"no connection within {seconds} s") from exc
        raise
    finally:
        del connection.get_connection_params


@contextlib.contextmanager
def transaction_until(connection, cursor, deadline: float | None) -> Iterator[None]:
    """One chunk's transaction; with a ``deadline``, limited to the time left (PostgreSQL).

    That one is begun and ended by hand: Django's ``atomic`` would open the
    connection again after a rollback that failed on a cut one, and the new
    connection would wait for a silent server as long as the old one did.
    """
    if deadline is None:
        with atomic(using=connection.alias):
            yield
        return
    if connection.in_atomic_block:
        raise TransactionManagementError("a write of run times with a timeout runs in transactions of its own")
    try:
        cursor.execute("BEGIN")
        _limit(cursor, deadline)
        yield
        cursor.execute("COMMIT")
    except BaseException:
        try:
            cursor.execute("ROLLBACK")
        except Error:
            connection.close()  # cut, or broken: closed, and opened again only by the next caller
        raise


def _limit(cursor, deadline: float) -> None:
    """PostgreSQL: the time left until ``deadline`` as this transaction's statement and lock timeouts."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise OutOfTime("no time left for the next chunk")
    milliseconds = str(max(1, int(left * 1000)))
    # set_config(..., true) is SET LOCAL, with parameters (SET takes none when the driver binds on the server).
    cursor.execute(
        "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)",
        [milliseconds, milliseconds],
    )


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (a Django error, or its driver's) says the write ran out of its time."""
    if isinstance(exc, OutOfTime):
        return True
    cause = exc.__cause__ or exc
    return (getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None)) in TIMED_OUT
