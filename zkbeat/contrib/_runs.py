"""Writing run times back to django-celery-beat's rows: many rows per statement.

django-celery-beat writes each row it ran with ``save()``: a read of the
row, then a write of every column, two queries a row. A leader that runs
10,000 rows a minute would send 60,000 queries at each three-minute sync
(100,000 rows: a minute of a blocked loop). Here the two fields it writes
(``last_run_at``, ``total_run_count``) go out in one ``UPDATE ... FROM
(VALUES ...)`` per few hundred rows on PostgreSQL and SQLite (3.33 and
newer), and one ``UPDATE`` per row elsewhere.

Only rows still enabled are written (``save()`` clears ``last_run_at`` of a
disabled row; a row disabled since it ran keeps it cleared). Neither
``save()``'s checks nor its signals run: ``date_changed`` stays the
operator's last edit, and the write is not mistaken for one.

With ``only_newer``, only rows whose ``last_run_at`` is empty or older than
the one written: a leader's write after it handed over
(zkbeat.contrib.django) must not lower a newer run its successor wrote
meanwhile. The condition is in the ``UPDATE``'s own ``WHERE``. On
PostgreSQL that write also never waits for a row lock: each chunk first
locks its rows ``FOR UPDATE SKIP LOCKED`` and writes only those. A row
another transaction is writing (the successor's sync, many rows in one
statement, in an order of its plan's choosing) is left to it; waiting for
it could close a cycle with the successor, and PostgreSQL would abort one
of the two writes as a deadlock.

With ``timeout`` (the write at exit, which holds the process's exit), on
PostgreSQL each chunk is a transaction bounded by ``stall`` seconds and by
what is left of the ``timeout`` (zkbeat.contrib._time_limit); a chunk cut
short rolls back, and the chunks after it are not tried. (A signal would not end a hung call: Python runs
its handler only once the driver returns.) Other databases have no such
bound here: each statement on SQLite waits for a lock at most its busy
``timeout`` (5 s unless the database's ``OPTIONS`` say otherwise); MySQL
waits for a row lock as long as its ``innodb_lock_wait_timeout``, for a
table lock as long as its ``lock_wait_timeout``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime

from django.db import DatabaseError, Error, connections, router
from django.db.models import Model, Q

from ._time_limit import cut_off, timed_out, transaction_until

__all__ = ["RunTimesNotWritten", "write_run_times"]

#: Rows per statement: PostgreSQL takes any number; SQLite before 3.32 took 999 parameters.
CHUNK = {"postgresql": 1000, "sqlite": 300}


class RunTimesNotWritten(DatabaseError):
    """A write of run times ended early: ``left`` of ``total`` rows were not written (their chunks rolled back)."""

    def __init__(self, left: int, total: int, cause: BaseException, timed_out: bool) -> None:
        super().__init__(str(cause))
        self.left, self.total, self.cause, self.timed_out = left, total, cause, timed_out

    @property
    def reason(self) -> str:
        """The first line of what the database or the driver said."""
        return (str(self.cause).strip().splitlines() or [type(self.cause).__name__])[0]


def write_run_times(
    model: type[Model],
    runs: Sequence[tuple[int, datetime, int]],
    *,
    only_newer: bool = False,
    timeout: float | None = None,
    stall: float | None = None,
) -> None:
    """Write (pk, last_run_at, total_run_count) to each row of ``model`` that is still enabled.

    ``only_newer``: and whose ``last_run_at`` is empty or older than the one written (on PostgreSQL: and
    that no other transaction holds locked; this write never waits for one). ``timeout``: seconds the
    whole write may take, on PostgreSQL; ``stall``: seconds each chunk of it may take (a database that
    takes longer is taken to hang; one that makes progress gets the whole ``timeout``). Raises
    :class:`RunTimesNotWritten` (a ``DatabaseError``).
    """
    if not runs:
        return
    connection = connections[router.db_for_write(model)]
    limited = timeout is not None and connection.vendor == "postgresql"
    deadline = time.monotonic() + timeout if limited else None
    written = 0
    try:
        with cut_off(connection, deadline, stall) as next_chunk:
            if _joins(connection):
                for done in _write_joined(model, connection, runs, only_newer, next_chunk):
                    written += done
                return
            manager = model._default_manager.db_manager(connection.alias)
            for pk, last_run_at, total_run_count in runs:
                rows = manager.filter(pk=pk, enabled=True)
                if only_newer:
                    rows = rows.filter(Q(last_run_at__isnull=True) | Q(last_run_at__lt=last_run_at))
                rows.update(last_run_at=last_run_at, total_run_count=total_run_count)
                written += 1
    except Error as exc:
        raise RunTimesNotWritten(len(runs) - written, len(runs), exc, timed_out(exc)) from exc


def _joins(connection) -> bool:
    """Whether the database takes ``UPDATE ... FROM (VALUES ...)`` (PostgreSQL, SQLite 3.33 and newer)."""
    vendor = connection.vendor
    return vendor == "postgresql" or (vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 33))


def _write_joined(
    model: type[Model],
    connection,
    runs: Sequence[tuple[int, datetime, int]],
    only_newer: bool = False,
    next_chunk: Callable[[], float] | None = None,
) -> Iterator[int]:
    """``UPDATE table SET ... FROM (VALUES ...) WHERE table.id = v.id AND table.enabled``, a chunk at a time.

    Yields the number of runs of each chunk once it is written (committed, outside a caller's transaction).
    ``next_chunk``: each chunk's deadline, asked for as it begins (zkbeat.contrib._time_limit.cut_off).
    """
    meta = model._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    pk, last_run, count, enabled = (quote(meta.get_field(f).column) for f in ("id", "last_run_at", "total_run_count",
                                                                            "enabled"))  # fmt: skip
    if connection.vendor == "postgresql":
        # Typed, so that the server need not guess from the first row (psycopg 3 binds on the server).
        casts = [f"::{meta.get_field(f).cast_db_type(connection)}" for f in ("id", "last_run_at", "total_run_count")]
        row = f"(%s{casts[0]}, %s{casts[1]}, %s{casts[2]})"
        source = "v (id, last_run_at, total_run_count)"
        columns = ("v.id", "v.last_run_at", "v.total_run_count")
    else:
        row = "(%s, %s, %s)"
        source = "v"
        columns = ("v.column1", "v.column2", "v.column3")
    where = f"{table}.{pk} = {columns[0]} AND {table}.{enabled}"
    if only_newer:
        where += f" AND ({table}.{last_run} IS NULL OR {table}.{last_run} < {columns[1]})"
    size = CHUNK[connection.vendor]
    adapt = connection.ops.adapt_datetimefield_value

    def update(cursor, chunk: Sequence[tuple[int, datetime, int]]) -> None:
        params: list = []
        for key, last_run_at, total_run_count in chunk:
            params += (key, adapt(last_run_at), total_run_count)
        cursor.execute(
            f"UPDATE {table} SET {last_run} = {columns[1]}, {count} = {columns[2]} "
            f"FROM (VALUES {', '.join([row] * len(chunk))}) AS {source} "
            f"WHERE {where}",
            params,
        )

    skip_locked = only_newer and connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        for start in range(0, len(runs), size):
            chunk = runs[start : start + size]
            if not skip_locked and next_chunk is None:
                update(cursor, chunk)
                yield len(chunk)
                continue
            deadline = None if next_chunk is None else next_chunk()
            with transaction_until(connection, cursor, deadline):  # its rows stay locked until its UPDATE is done
                if skip_locked:
                    cursor.execute(
                        f"SELECT {pk} FROM {table} WHERE {pk} = ANY(%s{casts[0]}[]) FOR UPDATE SKIP LOCKED",
                        [[key for key, _, _ in chunk]],
                    )
                    locked = {key for (key,) in cursor.fetchall()}
                    writing = [run for run in chunk if run[0] in locked]
                else:
                    writing = chunk
                if writing:
                    update(cursor, writing)
            yield len(chunk)
