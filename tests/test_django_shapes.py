"""Rows of one task whose headers are equal in Python but not as JSON: each message is the row's own.

django-celery-beat rows name themselves in ``periodic_task_name``; since
that header no longer makes a shape of its own, rows of one task share a
shape whenever the rest of their options compare equal. ``1 == True`` and
``{"a": 1, "b": 2} == {"b": 2, "a": 1}`` in Python, but Celery writes each
row's headers as the row holds them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.support.djangosupport import ON_THE_DATABASE, interval_task
from tests.support.helpers import Published, lead_until_published, wait_for
from tests.support.messages import queued_messages
from tests.support.servers import RedisServer

pytestmark = ON_THE_DATABASE


def _sent_headers(
    make_scheduler, redis: RedisServer, published: Published, rows: dict[str, str]
) -> list[tuple[str, dict]]:
    """Rows (name -> their ``headers`` field) all due at once, through the batch path: (row, its message's
    headers) of every message of theirs in the queue."""
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    for name, headers in rows.items():
        interval_task(name, 3600, headers=headers, last_run_at=long_ago)
    scheduler = make_scheduler(broker_url=redis.url)
    lead_until_published(scheduler, published, rows)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = [m["headers"] for m in queued_messages(redis.port)]
    return [(headers["zkbeat-entry"], headers) for headers in sent if headers.get("zkbeat-entry") in rows]


def test_rows_whose_headers_are_equal_only_in_python_each_go_out_with_their_own_headers(
    make_scheduler, redis_server_private: RedisServer, published: Published
) -> None:
    rows = {}
    for n in range(6):
        rows[f"int-{n}"] = '{"flag": 1}'
        rows[f"bool-{n}"] = '{"flag": true}'
        rows[f"float-{n}"] = '{"flag": 1.0}'
    wrong = [
        (name, headers["flag"])
        for name, headers in _sent_headers(make_scheduler, redis_server_private, published, rows)
        if type(headers["flag"]) is not type(json.loads(rows[name])["flag"])
    ]
    assert not wrong, f"rows sent with another row's header value: {sorted(wrong)}"


def test_rows_whose_headers_differ_only_in_order_each_go_out_in_their_own_order(
    make_scheduler, redis_server_private: RedisServer, published: Published
) -> None:
    """Celery writes a row's headers in the row's order (kombu's JSON keeps it): a shape shared by dict equality
    writes the first row's order into every other row's message."""
    rows = {}
    for n in range(4):
        rows[f"xy-{n}"] = '{"x": 1, "y": 2}'
        rows[f"yx-{n}"] = '{"y": 2, "x": 1}'
        # A header holding the row's own name, before and after another one.
        rows[f"named-first-{n}"] = json.dumps({"z": f"named-first-{n}", "y": 2})
        rows[f"named-last-{n}"] = json.dumps({"y": 2, "z": f"named-last-{n}"})
    wrong = []
    for name, headers in _sent_headers(make_scheduler, redis_server_private, published, rows):
        want = list(json.loads(rows[name]))
        got = [key for key in headers if key in want]
        if got != want:
            wrong.append((name, got))
    assert not wrong, f"rows sent with another row's header order: {sorted(wrong)}"


def test_a_row_whose_header_changes_from_1_to_true_goes_out_with_true(
    make_scheduler, redis_server_private: RedisServer, published: Published
) -> None:
    """A row without arguments keeps its prepared message while its options compare equal: ``1 == True``."""
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    interval_task("flagged", 1, headers='{"flag": 1}')
    scheduler = make_scheduler(broker_url=redis_server_private.url)
    lead_until_published(scheduler, published, ["flagged"], times=2)
    row = PeriodicTask.objects.get(name="flagged")
    row.headers = '{"flag": true}'
    row.save()
    PeriodicTasks.update_changed()
    changed = len(queued_messages(redis_server_private.port))

    def flags() -> list:
        return [m["headers"]["flag"] for m in queued_messages(redis_server_private.port)][changed:]

    wait_for(lambda: scheduler.tick() is not None and len(flags()) >= 5, timeout=60)
    assert flags()[-1] is True, f"the row's messages after its change: {flags()}"
