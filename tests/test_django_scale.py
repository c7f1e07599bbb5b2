"""zkbeat.DatabaseScheduler over a large django-celery-beat table on real PostgreSQL: a change reads what changed.

One leader (in this process, on the shared ZooKeeper and Redis) reads the
rows once, in the module's fixture; each test then changes a few rows the
way the admin, an admin action, a script or raw SQL does, runs one pass of
the leader, and counts which statements read the task table and how many
rows each returned. The rows are hourly, so nothing of theirs comes due
while the module runs; a 1 s task beside them shows the schedule runs.

``ZKBEAT_TEST_BIG_ROWS`` sets the number of rows: 20,000 by default, so that
the module stays near half a minute (the fixture fills the table with one
``INSERT ... SELECT`` in a few seconds, and the takeover reads it); with
100,000 the module takes one to two minutes on a loaded two-core machine,
and ``make bench`` (bench/database.py) times the 100,000-row takeover.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from tests.support.djangosupport import CapturedSql, capture_sql, interval_task
from tests.support.helpers import Published, lead, wait_for

ROWS = int(os.environ.get("ZKBEAT_TEST_BIG_ROWS", "20000"))
TASKS = "django_celery_beat_periodictask"
#: What every task row has: reading whole rows names this column; the id set does not.
WHOLE_ROW = '"args"'


@pytest.fixture(scope="module")
def big_leader(django_database: str, zk_server, redis_server) -> Iterator[Any]:
    """A leading DatabaseScheduler that has read ROWS hourly rows (and one 1 s task) once."""
    from django.db import connection
    from django_celery_beat.models import IntervalSchedule

    from tests.support.djangosupport import TABLES
    from zkbeat.contrib.django import DatabaseScheduler

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
    hourly = IntervalSchedule.objects.create(every=3600, period=IntervalSchedule.SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TASKS} (name, task, args, kwargs, headers, enabled, last_run_at, total_run_count, "
            "date_changed, description, interval_id, one_off) "
            "SELECT 'row-' || lpad(i::text, 6, '0'), 'jobs.cleanup_messages', '[]', '{}', '{}', true, now(), 0, "
            "now(), '', %s, false FROM generate_series(0, %s) AS i",
            [hourly.pk, ROWS - 1],
        )
    interval_task("heartbeat", 1)
    filled = time.monotonic()

    app = Celery("zkbeat-test", set_as_current=False)
    app.conf.update(
        broker_url=redis_server.url,
        zkbeat_hosts=zk_server.hosts,
        zkbeat_root=f"/t/big-{uuid.uuid4().hex[:8]}",
        zkbeat_session_timeout=10,
        zkbeat_identity="big-leader",
        zkbeat_stall_timeout=300,  # a loaded machine's takeover of 100,000 rows is not a hung leader
        beat_max_loop_interval=0.5,
        beat_schedule={},
    )
    scheduler = DatabaseScheduler(app)
    try:
        lead(scheduler, timeout=30)
        scheduler.tick()  # takes over: reads every row, publishes what is due, upserts beat_schedule
        assert scheduler.leading and len(scheduler.schedule) >= ROWS
        assert row("celery.backend_cleanup").enabled, "beat_schedule's upsert after the first pass"
        logging.getLogger(__name__).warning(
            "%d rows: filled in %.1f s, read by the new leader in %.1f s",
            ROWS,
            filled - started,
            time.monotonic() - filled,
        )
        yield scheduler
    finally:
        scheduler.close()


def one_pass(scheduler: Any) -> CapturedSql:
    """The leader's next pass, and every statement it sent."""
    with capture_sql() as queries:
        scheduler.tick()
    return queries


def whole_rows(queries: CapturedSql) -> list[int]:
    """Rows returned by each statement that read task rows whole (every column)."""
    return [rows for sql, rows in queries.reading(TASKS) if WHOLE_ROW in sql]


def id_sets(queries: CapturedSql) -> list[int]:
    """Rows returned by each statement that read only the ids (and what tells a change) of the task rows."""
    return [rows for sql, rows in queries.reading(TASKS) if WHOLE_ROW not in sql]


def row(name: str):
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name)


def test_an_edit_in_the_admin_reads_that_row_alone(big_leader) -> None:
    """A save() of one row of many reads the enabled id set and that one row, and rebuilds that entry only."""
    untouched = big_leader.schedule["row-000002"]
    task = row("row-000001")
    task.args = '["edited"]'
    task.save()
    from django_celery_beat.models import PeriodicTask

    enabled = PeriodicTask.objects.filter(enabled=True).count()  # the rows, the 1 s task, celery.backend_cleanup
    queries = one_pass(big_leader)
    assert whole_rows(queries) == [1], queries.reading(TASKS)
    assert id_sets(queries) == [enabled], queries.reading(TASKS)
    assert big_leader.schedule["row-000001"].args == ["edited"]
    assert big_leader.schedule["row-000002"] is untouched


def test_a_deletion_and_a_disable_read_the_id_set_only(big_leader) -> None:
    """A deleted row and a disabled one leave the schedule on the next pass; no task row is read whole."""
    row("row-000003").delete()
    disabled = row("row-000004")
    disabled.enabled = False
    disabled.save()
    queries = one_pass(big_leader)
    assert whole_rows(queries) == [], queries.reading(TASKS)
    assert len(id_sets(queries)) == 1
    assert "row-000003" not in big_leader.schedule and "row-000004" not in big_leader.schedule
    assert "row-000005" in big_leader.schedule


def test_an_admin_action_that_disables_with_update_is_seen(big_leader) -> None:
    """django-celery-beat's admin actions disable with QuerySet.update and bump the marker: the rows leave."""
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    PeriodicTask.objects.filter(name__in=["row-000006", "row-000007"]).update(enabled=False)
    PeriodicTasks.update_changed()
    queries = one_pass(big_leader)
    assert whole_rows(queries) == []
    assert "row-000006" not in big_leader.schedule and "row-000007" not in big_leader.schedule

    PeriodicTask.objects.filter(name="row-000006").update(enabled=True)
    PeriodicTasks.update_changed()
    queries = one_pass(big_leader)
    assert whole_rows(queries) == [1], queries.reading(TASKS)
    assert "row-000006" in big_leader.schedule


def test_a_shared_interval_edited_in_the_admin_rebuilds_the_tasks_on_it(big_leader) -> None:
    """A task's date_changed does not move when its IntervalSchedule is edited: the schedule row's own read tells."""
    from datetime import timedelta

    from django_celery_beat.models import IntervalSchedule

    every = IntervalSchedule.objects.create(every=7, period=IntervalSchedule.SECONDS)
    moved = row("row-000008")
    moved.interval = every
    moved.save()
    one_pass(big_leader)
    assert big_leader.schedule["row-000008"].schedule.run_every == timedelta(seconds=7)
    every.every = 9
    every.save()  # signals the marker; row-000008's own row is unchanged
    queries = one_pass(big_leader)
    assert whole_rows(queries) == [1], queries.reading(TASKS)
    assert big_leader.schedule["row-000008"].schedule.run_every == timedelta(seconds=9)


def test_a_row_written_without_the_marker_is_found_by_the_full_read(big_leader, monkeypatch) -> None:
    """QuerySet.update moves neither date_changed nor the marker; the periodic full read finds it, builds it alone."""
    from django_celery_beat.models import PeriodicTask

    import zkbeat.contrib.django

    untouched = big_leader.schedule["row-000010"]
    PeriodicTask.objects.filter(name="row-000009").update(kwargs='{"quietly": true}')
    queries = one_pass(big_leader)
    assert queries.reading(TASKS) == [], "nothing said the schedule changed: no task row is read"
    assert big_leader.schedule["row-000009"].kwargs == {}

    monkeypatch.setattr(zkbeat.contrib.django, "FULL_RELOAD_INTERVAL", 0)
    one_pass(big_leader)
    assert big_leader.schedule["row-000009"].kwargs == {"quietly": True}
    assert big_leader.schedule["row-000010"] is untouched, "an unchanged row is not built again"


def test_run_times_the_leader_wrote_are_not_changes(big_leader, monkeypatch) -> None:
    """The full read ignores last_run_at and total_run_count: rows the leader synced are not built again."""
    from django.utils import timezone

    import zkbeat.contrib.django

    entry = big_leader.schedule["row-000012"]
    entry.model.last_run_at = timezone.now()
    entry.model.total_run_count = 5
    big_leader._dirty.add("row-000012")  # as if it had just run
    big_leader.sync()
    assert row("row-000012").total_run_count == 5
    monkeypatch.setattr(zkbeat.contrib.django, "FULL_RELOAD_INTERVAL", 0)
    queries = one_pass(big_leader)
    assert len(whole_rows(queries)) == 1, "a full read"
    assert big_leader.schedule["row-000012"] is entry


def test_a_bad_row_edited_in_is_logged_once_and_left_out(big_leader, published: Published, caplog) -> None:
    """A row saved with arguments that are not JSON is left out with one error, across reads; the rest run."""
    from django_celery_beat.models import PeriodicTasks

    bad = row("row-000011")
    bad.args = "not json"
    bad.save()  # PeriodicTask.save() does not check args; the admin's form would have
    one_pass(big_leader)
    assert "row-000011" not in big_leader.schedule
    start = published.count("heartbeat")
    for _ in range(3):
        PeriodicTasks.update_changed()
        one_pass(big_leader)
    wait_for(lambda: big_leader.tick() is not None and published.count("heartbeat") >= start + 2, timeout=20)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "row-000011" in r.getMessage()]
    assert len(errors) == 1 and "args" in errors[0], errors

    bad.args = '["mended"]'
    bad.save()
    one_pass(big_leader)
    assert big_leader.schedule["row-000011"].args == ["mended"]
