"""beat_schedule entries of one task whose options are equal in Python but not as JSON go out with their own."""

from __future__ import annotations

from tests.support.helpers import Published, every, lead_until_published
from tests.support.messages import queued_messages
from tests.support.servers import RedisServer


def test_entries_whose_headers_are_equal_only_in_python_each_go_out_with_their_own_headers(
    make_scheduler, redis_server_private: RedisServer, published: Published
) -> None:
    entries = {}
    for n in range(4):
        entries[f"int-{n}"] = every(1, n, options={"headers": {"flag": 1}})
        entries[f"bool-{n}"] = every(1, n, options={"headers": {"flag": True}})
    scheduler = make_scheduler(entries, broker_url=redis_server_private.url)
    lead_until_published(scheduler, published, entries, times=2)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    wrong = sorted(
        {
            (m["headers"]["zkbeat-entry"], m["headers"]["flag"])
            for m in queued_messages(redis_server_private.port)
            if type(m["headers"]["flag"])
            is not type(entries[m["headers"]["zkbeat-entry"]]["options"]["headers"]["flag"])
        }
    )
    assert not wrong, f"entries sent with another entry's header value: {wrong}"
