"""beat_schedule entries of one task whose options are equal in Python but not as JSON go out with their own."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.helpers import Published, every, lead, wait_for
from tests.support.servers import RedisServer


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def test_entries_whose_headers_are_equal_only_in_python_each_go_out_with_their_own_headers(
    make_scheduler, own_redis: RedisServer, published: Published
) -> None:
    import redis

    entries = {}
    for n in range(4):
        entries[f"int-{n}"] = every(1, n, options={"headers": {"flag": 1}})
        entries[f"bool-{n}"] = every(1, n, options={"headers": {"flag": True}})
    scheduler = make_scheduler(entries, broker_url=own_redis.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and all(published.count(n) >= 2 for n in entries), timeout=60)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    client = redis.Redis(port=own_redis.port)
    try:
        raw = [json.loads(m) for key in client.keys("celery*") for m in client.lrange(key, 0, -1)]
    finally:
        client.close()
    wrong = sorted(
        {
            (m["headers"]["zkbeat-entry"], m["headers"]["flag"])
            for m in raw
            if type(m["headers"]["flag"])
            is not type(entries[m["headers"]["zkbeat-entry"]]["options"]["headers"]["flag"])
        }
    )
    assert not wrong, f"entries sent with another entry's header value: {wrong}"
