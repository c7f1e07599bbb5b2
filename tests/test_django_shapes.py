"""Rows of one task whose headers are equal in Python but not as JSON: each message is the row's own.

django-celery-beat rows name themselves in ``periodic_task_name``; since
that header no longer makes a shape of its own, rows of one task share a
shape whenever the rest of their options compare equal. ``1 == True`` and
``{"a": 1, "b": 2} == {"b": 2, "a": 1}`` in Python, but Celery writes each
row's headers as the row holds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.djangosupport import interval_task
from tests.support.helpers import Published, lead, wait_for
from tests.support.servers import RedisServer

pytestmark = pytest.mark.usefixtures("beat_db")


@pytest.fixture
def beat_scheduler() -> str:
    return "zkbeat.DatabaseScheduler"


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def _raw_messages(port: int) -> list[dict]:
    import redis

    client = redis.Redis(port=port)
    try:
        raw = [item for key in sorted(client.keys("celery*")) for item in client.lrange(key, 0, -1)]
    finally:
        client.close()
    return [json.loads(item) for item in raw]


def test_rows_whose_headers_are_equal_only_in_python_each_go_out_with_their_own_headers(
    make_scheduler, own_redis: RedisServer, published: Published
) -> None:
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    rows = {}
    for n in range(6):
        rows[f"int-{n}"] = '{"flag": 1}'
        rows[f"bool-{n}"] = '{"flag": true}'
        rows[f"float-{n}"] = '{"flag": 1.0}'
    for name, headers in rows.items():
        interval_task(name, 3600, headers=headers, last_run_at=long_ago)
    scheduler = make_scheduler(broker_url=own_redis.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and all(published.count(name) >= 1 for name in rows), timeout=60)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    wrong = []
    for message in _raw_messages(own_redis.port):
        name = message["headers"].get("zkbeat-entry")
        if name not in rows:
            continue
        want = json.loads(rows[name])["flag"]
        got = message["headers"]["flag"]
        if type(got) is not type(want):
            wrong.append((name, got))
    assert not wrong, f"rows sent with another row's header value: {sorted(wrong)}"


def test_rows_whose_headers_differ_only_in_order_each_go_out_in_their_own_order(
    make_scheduler, own_redis: RedisServer, published: Published
) -> None:
    """Celery writes a row's headers in the row's order (kombu's JSON keeps it): a shape shared by dict equality
    writes the first row's order into every other row's message."""
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    rows = {}
    for n in range(4):
        rows[f"xy-{n}"] = '{"x": 1, "y": 2}'
        rows[f"yx-{n}"] = '{"y": 2, "x": 1}'
        # A header holding the row's own name, before and after another one.
        rows[f"named-first-{n}"] = json.dumps({"z": f"named-first-{n}", "y": 2})
        rows[f"named-last-{n}"] = json.dumps({"y": 2, "z": f"named-last-{n}"})
    for name, headers in rows.items():
        interval_task(name, 3600, headers=headers, last_run_at=long_ago)
    scheduler = make_scheduler(broker_url=own_redis.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and all(published.count(name) >= 1 for name in rows), timeout=60)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    wrong = []
    for message in _raw_messages(own_redis.port):
        name = message["headers"].get("zkbeat-entry")
        if name not in rows:
            continue
        want = list(json.loads(rows[name]))
        got = [key for key in message["headers"] if key in want]
        if got != want:
            wrong.append((name, got))
    assert not wrong, f"rows sent with another row's header order: {sorted(wrong)}"


def test_a_row_whose_header_changes_from_1_to_true_goes_out_with_true(
    make_scheduler, own_redis: RedisServer, published: Published
) -> None:
    """A row without arguments keeps its prepared message while its options compare equal: ``1 == True``."""
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    interval_task("flagged", 1, headers='{"flag": 1}')
    scheduler = make_scheduler(broker_url=own_redis.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("flagged") >= 2, timeout=60)
    row = PeriodicTask.objects.get(name="flagged")
    row.headers = '{"flag": true}'
    row.save()
    PeriodicTasks.update_changed()
    changed = len(_raw_messages(own_redis.port))

    def flags() -> list:
        return [m["headers"]["flag"] for m in reversed(_raw_messages(own_redis.port))][changed:]

    wait_for(lambda: scheduler.tick() is not None and len(flags()) >= 5, timeout=60)
    assert flags()[-1] is True, f"the row's messages after its change: {flags()}"
