"""zkbeat.DatabaseScheduler's cost per row: its rows take the batch path's fast ways as beat_schedule entries do.

In-process on real PostgreSQL, ZooKeeper and Redis (a Redis of the test's
own, whose queue the tests read). A django-celery-beat row's message names
the row in a header of its own (``periodic_task_name``, from the entry's
options), so no two rows have equal options; the messages must still be
made from one shape per task, byte for byte what kombu writes.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.djangosupport import ON_THE_DATABASE, interval_task
from tests.support.helpers import Published, lead, lead_until_published, wait_for
from tests.support.messages import compare_shaped_messages, queued_messages
from tests.support.servers import RedisServer
from zkbeat.leading import batch_publish

pytestmark = ON_THE_DATABASE

ROWS = 16


def test_rows_share_a_message_shape_and_each_first_message_is_the_one_kombu_writes(
    make_scheduler, redis_server_private: RedisServer, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of one task: all but a few first messages are made from the task's shape, not built by Celery.

    Each one made from the shape is compared, byte for byte, with the message
    kombu writes on the same channel for the same row, task id, slot and
    delivery tag; every row is in the queue once, named in its own
    ``periodic_task_name`` header, with its own arguments.
    """
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    rows = {f"row-{n:02d}": [n, f"row-{n:02d}"] for n in range(ROWS)}
    rows["no-args"] = []
    for name, args in rows.items():
        # A task no app registers here: whether an earlier test in this process imported the example project's
        # jobs.tasks (whose cleanup_messages takes no arguments, and Celery checks them) must not matter.
        interval_task(name, 3600, task="pace.rows", args=json.dumps(args), last_run_at=long_ago)
    compared = compare_shaped_messages(monkeypatch, lambda: scheduler.zk_settings.root)
    through_celery: list[str] = []
    celery_path = batch_publish._through_celery

    def counted(broker, sender, entry, options, producer):
        through_celery.append(entry.name)
        return celery_path(broker, sender, entry, options, producer)

    monkeypatch.setattr(batch_publish, "_through_celery", counted)
    scheduler = make_scheduler(broker_url=redis_server_private.url)
    lead_until_published(scheduler, published, rows)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    # Through Celery: the first row (its shape is kept). Through kombu: the two the shape's template is cut from
    # and checked on. Every other row's first message is made from the shape.
    assert len([name for name in through_celery if name in rows]) == 1, f"built by Celery: {through_celery}"
    assert len(compared) >= len(rows) - 3, f"first messages made from the shape: {compared}"
    messages = [m for m in queued_messages(redis_server_private.port) if m["headers"].get("zkbeat-entry") in rows]
    assert sorted(m["headers"]["zkbeat-entry"] for m in messages) == sorted(rows)
    for message in messages:
        name, headers = message["headers"]["zkbeat-entry"], message["headers"]
        assert headers["periodic_task_name"] == name
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert (args, kwargs) == (rows[name], {}), name
        assert headers["id"] == message["properties"]["correlation_id"], name


def test_a_pass_reads_django_celery_beats_clock_once_not_per_row(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interval rows due together: their is_due and beat's heap times come from one reading of the clock per pass.

    django-celery-beat's interval schedules read Django's clock (a time-zone
    conversion) on every ``is_due()`` and every heap time, three times per
    row published; the pass reads it once and answers each row from that
    reading, by the same arithmetic. Every row still runs once.
    """
    import django_celery_beat.models
    from django_celery_beat.models import PeriodicTask

    rows = [f"row-{n:03d}" for n in range(200)]
    for name in rows:
        interval_task(name, 3600)
    soon = datetime.now(timezone.utc) - timedelta(seconds=3600 - 8)  # every row due 8 s from now
    PeriodicTask.objects.filter(name__in=rows).update(last_run_at=soon)
    scheduler = make_scheduler()
    lead(scheduler)
    scheduler.tick()  # takes over: reads the rows and places them on beat's heap
    assert len(scheduler.schedule) >= len(rows) and not any(published.count(name) for name in rows)
    real_now = django_celery_beat.models.now
    readings: list[int] = []

    def now():  # counted within the leader's passes (between them, each tick reads it once to know how long to wait)
        if scheduler.pass_clock.running:
            readings.append(1)
        return real_now()

    monkeypatch.setattr(django_celery_beat.models, "now", now)
    wait_for(lambda: scheduler.tick() is not None and all(published.count(name) >= 1 for name in rows), timeout=60)
    assert all(published.count(name) == 1 for name in rows)
    assert len(readings) <= 10, f"{len(readings)} readings of django-celery-beat's clock in passes, {len(rows)} rows"
