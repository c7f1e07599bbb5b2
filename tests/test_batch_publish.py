"""Ticks due together go to Redis in one pipeline, each message from a shape prepared once.

What must hold on that path is what held one message at a time: every tick
in the queue once, with zkbeat's headers (entry, slot, epoch), its task id
and its arguments; and when the link drops in the middle of the write, the
messages of the chunk being written count as "may have arrived" (never sent
again), while those not yet written stay due and go out once later. A
message longer than Redis takes is left out alone; ``after_task_publish``
fires for each message Redis answered that it took, and for no other. The
tests read the queue in Redis itself, past the proxy.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from celery.utils.saferepr import saferepr

from tests.support.helpers import Published, connected, every, lead, lead_until_published, wait_for
from tests.support.messages import compare_shaped_messages, queued_messages
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer
from tests.test_uncertain_publish import uncertain_slots
from zkbeat.leading import batch_publish
from zkbeat.ticking.ticks import task_id_for

ENTRIES = 12


def run_count(scheduler: Any, entry: str) -> int:
    return scheduler.ledger.load([entry])[entry].state.total_run_count


def test_a_batch_puts_every_tick_in_the_queue_once_with_its_headers_task_id_and_arguments(
    make_scheduler, proxied_redis: tuple[RedisServer, TcpProxy], published: Published
) -> None:
    """Entries due together go out through the pipeline: each tick once, headers, task id and body as Celery builds."""
    server, _ = proxied_redis
    entries = {f"batch-{n:02d}": every(1, n) for n in range(ENTRIES)}
    entries["batch-own"] = every(1, "x", kwargs={"k": [1, 2]}, options={"headers": {"x-mine": "kept"}, "priority": 3})
    scheduler = make_scheduler(entries, broker_url=server.url)
    lead_until_published(scheduler, published, entries, times=3)
    batch = scheduler.term.publisher.batch
    assert batch is not None and batch.shapes, "the ticks did not go through the pipeline path"
    messages = queued_messages(server.port)
    pairs = [(m["headers"]["zkbeat-entry"], m["headers"]["zkbeat-slot"]) for m in messages]
    assert len(pairs) == len(set(pairs)), f"a tick was queued twice: {Counter(pairs).most_common(3)}"
    root = scheduler.zk_settings.root
    for message in messages:
        headers, properties = message["headers"], message["properties"]
        name, slot = headers["zkbeat-entry"], headers["zkbeat-slot"]
        assert headers["zkbeat-epoch"] == scheduler.term.epoch
        task_id = task_id_for(root, name, datetime.fromisoformat(slot))
        assert headers["id"] == headers["root_id"] == properties["correlation_id"] == task_id
        assert headers["task"] == "zkbeat.test"
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        if name == "batch-own":
            assert (args, kwargs, headers["x-mine"]) == (["x"], {"k": [1, 2]}, "kept")
            assert headers["argsrepr"] == "['x']" and properties["priority"] == 3
        else:
            assert args == [int(name.rsplit("-", 1)[1])] and kwargs == {}
            assert headers["argsrepr"] == f"[{args[0]}]"
    for name in entries:
        assert run_count(scheduler, name) == sum(1 for entry, _ in pairs if entry == name), name


def test_a_batch_cut_mid_write_counts_the_chunk_as_maybe_sent_and_sends_the_rest_once_later(
    make_scheduler,
    proxied_redis: tuple[RedisServer, TcpProxy],
    published: Published,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The link drops inside a pipeline write: that chunk may have arrived, later chunks stay due; none twice."""
    server, proxy = proxied_redis
    monkeypatch.setattr(batch_publish, "CHUNK", 4)
    entries = {f"cut-{n:02d}": every(2, n) for n in range(ENTRIES)}
    scheduler = make_scheduler(
        entries,
        broker_url=f"redis://127.0.0.1:{proxy.port}/0",
        broker_transport_options={"socket_timeout": 1},
    )
    lead_until_published(scheduler, published, entries)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        proxy.cut_after(1500)  # inside the first message or two of the next pipeline write
        wait_for(
            lambda: scheduler.tick() is not None and "a batch of" in caplog.text,
            timeout=30,
            message=lambda: caplog.text,
        )
        after = {name: published.count(name) for name in entries}
        wait_for(
            lambda: scheduler.tick() is not None and all(published.count(n) >= after[n] + 2 for n in entries),
            timeout=60,
        )
    assert proxy.cuts, "the write was never cut: the test proved nothing"
    pairs = [(m["headers"]["zkbeat-entry"], m["headers"]["zkbeat-slot"]) for m in queued_messages(server.port)]
    assert len(pairs) == len(set(pairs)), f"a tick was queued twice: {Counter(pairs).most_common(3)}"
    uncertain = {(name, slot) for name in entries for slot in uncertain_slots(caplog, name)}
    assert len(uncertain) == 4, f"the chunk being written is 'may have arrived', no more, no less: {uncertain}"
    sent = {(h["zkbeat-entry"], h["zkbeat-slot"]) for h in published.headers if h["zkbeat-entry"] in entries}
    assert sent <= set(pairs) <= sent | uncertain, "a message reached the queue that was neither sent nor uncertain"
    assert "8 not tried" in caplog.text, caplog.text
    for name in entries:
        # Every run the ledger counts is in the queue, or was logged as maybe sent (and is at most once there).
        mine = {slot for entry, slot in pairs if entry == name}
        lost = {slot for entry, slot in uncertain if entry == name} - mine
        assert run_count(scheduler, name) == len(mine) + len(lost), name


def test_a_message_redis_refuses_in_a_batch_is_dropped_once_and_the_rest_go_out(
    make_scheduler, proxied_redis: tuple[RedisServer, TcpProxy], published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """An error reply to one LPUSH (its queue's key now holds a string) drops that tick as celery beat would."""
    server, _ = proxied_redis
    entries = {f"fine-{n:02d}": every(1, n) for n in range(4)}
    entries["refused"] = every(1, options={"queue": "refusing"})
    scheduler = make_scheduler(entries, broker_url=server.url)
    lead_until_published(scheduler, published, ["refused"], timeout=30)
    client = redis.Redis(port=server.port)
    client.delete("refusing")
    client.set("refusing", "not a list")  # the queue was declared already: only the LPUSH itself fails now
    client.close()
    before = {name: published.count(name) for name in entries}
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and all(published.count(n) >= before[n] + 3 for n in entries if n != "refused")
            ),
            timeout=60,
        )
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    refused = [r.getMessage() for r in caplog.records if "refused by the broker" in r.getMessage()]
    assert refused and all(text.startswith("zkbeat: refused (slot") for text in refused), caplog.text[-3000:]
    assert published.count("refused") == before["refused"], "after_task_publish fires only for what Redis took"
    assert run_count(scheduler, "refused") == before["refused"] + len(refused), "each refused tick counts as run once"
    assert scheduler.election.is_leader


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of the test's own, reached directly (no proxy)."""
    server = RedisServer().start()
    yield server
    server.stop()


def _lazy_now() -> int:
    return 1


def _queued(port: int) -> list[tuple[str, str]]:
    return [(m["headers"]["zkbeat-entry"], m["headers"]["zkbeat-slot"]) for m in queued_messages(port)]


def test_a_batch_keeps_one_shape_per_task_and_options_for_an_entry_with_a_lazy_argument(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """An entry whose arguments hold a BeatLazyFunc goes through Celery at every tick: the shape Celery builds
    each time is the one already kept, not one more (memory would grow for the term's life)."""
    from celery.beat import BeatLazyFunc

    entries = {"lazy": every(1, BeatLazyFunc(_lazy_now)), "plain": every(1, 0)}
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, entries, times=6)
    batch = scheduler.term.publisher.batch
    assert batch is not None, "the ticks did not go through the pipeline path"
    shapes = sum(len(kept) for kept in batch.shapes.values())
    # One task with one set of options: one shape is all there is to keep.
    assert shapes <= 1, f"{shapes} shapes kept for 1 task and 1 set of options after {published.count('lazy')} ticks"


def test_a_batch_fires_after_task_publish_for_an_entrys_first_tick_only_once_redis_took_it(
    make_scheduler, redis_server: RedisServer, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry's first tick is built by Celery, which would fire after_task_publish before the batch is
    written: Redis refuses it (WRONGTYPE), zkbeat drops it, and no receiver is told it was published."""
    now = datetime.now(timezone.utc)
    entries = {
        "warm": every(1, options={"queue": "refusing"}),  # declares the queue on beat's connection first
        "late": every(8, options={"queue": "refusing", "priority": 1}, last_run_at=now),  # other options: own shape
    }
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, ["warm"], timeout=30)
    client = redis.Redis(port=redis_server.port)
    client.delete("refusing")
    client.set("refusing", "not a list")  # from now on LPUSH to this queue gets WRONGTYPE
    client.close()
    assert published.count("late") == 0, "the test needs late's first tick after the key changed"
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and "zkbeat: late (slot" in caplog.text,
            timeout=60,
            message=lambda: caplog.text[-3000:],
        )
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("zkbeat: late (slot")]
    assert refused and all("was refused by the broker" in text for text in refused), refused
    assert published.count("late") == 0, "after_task_publish fired for a tick Redis refused and zkbeat dropped"


def test_a_message_over_redis_bulk_limit_is_dropped_alone_and_the_rest_of_its_chunk_reaches_the_queue(
    make_scheduler, redis_server: RedisServer, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis closes the connection on a message over its proto-max-bulk-len, and the commands written after it
    never run: zkbeat leaves that message out (logged, dropped as the per-message path would lose it), so every
    small tick of the pass that it counts as run is in the queue, pass after pass."""
    client = redis.Redis(port=redis_server.port)
    client.config_set("proto-max-bulk-len", 1024 * 1024)
    client.close()
    small = {f"small-{n}": every(1, n) for n in range(4)}
    entries = {**small, "huge": every(1, "x" * (1024 * 1024 + 10))}
    scheduler = make_scheduler(entries, broker_url=redis_server.url, broker_transport_options={"socket_timeout": 2})
    lead(scheduler)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and caplog.text.count("zkbeat: huge (slot") >= 4, timeout=60)
    assert "proto-max-bulk-len" in caplog.text, caplog.text[-3000:]
    queued = set(_queued(redis_server.port))
    assert not any(entry == "huge" for entry, _ in queued), "the oversized message reached the queue"
    lost = {}
    for name in small:
        runs = run_count(scheduler, name)
        there = sum(1 for entry, _ in queued if entry == name)
        if runs != there:
            lost[name] = runs - there
    assert not lost, f"ticks counted as run that never reached the queue: {lost}"


def test_a_batch_cut_while_replies_are_read_fires_after_task_publish_for_every_answered_message(
    make_scheduler, redis_server: RedisServer, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """The link closes while the pipeline's replies are read: each message whose reply was read is published
    and announced (after_task_publish); the rest are logged as may have arrived. None is in the queue silently."""
    proxy = TcpProxy(redis_server.port).start()
    try:
        entries = {f"reply-{n}": every(2, n) for n in range(6)}
        scheduler = make_scheduler(
            entries, broker_url=f"redis://127.0.0.1:{proxy.port}/0", broker_transport_options={"socket_timeout": 2}
        )
        lead_until_published(scheduler, published, entries)
        with caplog.at_level(logging.INFO, logger="zkbeat"):
            proxy.cut_replies_after(9)  # two LPUSH replies (":N\r\n") whole, then the link closes
            wait_for(lambda: scheduler.tick() is not None and "a batch of" in caplog.text, timeout=30)
        assert proxy.cuts, "the replies were never cut: the test proved nothing"
        signalled = {(h["zkbeat-entry"], h["zkbeat-slot"]) for h in published.headers}
        uncertain = {(name, slot) for name in entries for slot in uncertain_slots(caplog, name)}
        silent = {pair for pair in _queued(redis_server.port) if pair not in signalled and pair not in uncertain}
        assert not silent, f"{len(silent)} messages Redis took and answered, never signalled: {sorted(silent)}"
    finally:
        proxy.close()


def test_a_batch_forgets_the_prepared_messages_of_entries_that_left_the_schedule(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Entries that come and go under new names (one-off rows) leave nothing behind in the term's prepared
    bodies once they are out of the schedule."""
    scheduler = make_scheduler({"steady": every(1, 0)}, broker_url=redis_server.url)
    lead_until_published(scheduler, published, ["steady"], timeout=30)
    for n in range(8):
        name = f"one-off-{n}"
        scheduler.update_from_dict({name: every(1, n)})
        wait_for(lambda name=name: scheduler.tick() is not None and published.count(name) >= 2, timeout=30)
        del scheduler.schedule[name]
        scheduler.tick()
    batch = scheduler.term.publisher.batch
    assert batch is not None, "the ticks did not go through the pipeline path"
    kept = sorted(set(batch.bodies) - set(scheduler.schedule))
    assert not kept, f"{len(kept)} bodies kept for entries no longer in the schedule: {kept}"


_ROUTE = {"queue": "route-a"}


def _dynamic_route(name, args, kwargs, options, task=None, **kw):
    """A router function whose answer changes (a feature flag, a setting read at send time)."""
    return {"queue": _ROUTE["queue"]}


def test_a_batch_asks_a_router_function_at_every_tick(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery asks a router function at every send: once it moves the task to another queue, the batch's
    next ticks go there, not to the queue of its first answer."""
    _ROUTE["queue"] = "route-a"
    scheduler = make_scheduler({"routed": every(1, 0)}, broker_url=redis_server.url, task_routes=(_dynamic_route,))
    lead_until_published(scheduler, published, ["routed"], times=2, timeout=30)
    _ROUTE["queue"] = "route-b"
    before = published.count("routed")
    wait_for(lambda: scheduler.tick() is not None and published.count("routed") >= before + 3, timeout=30)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    client = redis.Redis(port=redis_server.port)
    try:
        in_b = client.llen("route-b")
    finally:
        client.close()
    assert in_b >= 2, f"{in_b} ticks in route-b after the router moved the task there"


def test_an_entrys_first_message_made_from_its_shape_is_the_message_kombu_writes_for_it(
    make_scheduler, proxied_redis: tuple[RedisServer, TcpProxy], published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries of one shape: from the third on, the first message is the shape's with the entry's fields put in.

    Each such message is compared, byte for byte, with the one kombu writes
    on the same channel for the same entry, task id, slot and delivery tag;
    and every tick is in the queue once with its own arguments.
    """
    server, _ = proxied_redis
    entries = {f"shaped-{n:02d}": every(30, n, f"shaped-{n:02d}") for n in range(ENTRIES)}
    entries.update(
        {
            "ünïcode-名前": every(30, "ünï", kwargs={"k": "名前"}),
            'quote"d': every(30, 'say "hi"', kwargs={"q": "it's"}),
            "back\\slash": every(30, "a\\b", kwargs={"nested": {"x": [1, 2.5, None, True]}}),
            "no-args": every(30),
            "[1]": every(30, 1),  # its name is another entry's argsrepr
        }
    )
    compared = compare_shaped_messages(monkeypatch, lambda: scheduler.zk_settings.root)
    scheduler = make_scheduler(entries, broker_url=server.url)
    lead_until_published(scheduler, published, entries)
    # Through kombu, at most four, by the order the pass met them in: the one the template is cut from and the
    # one it is checked on, and the same again when a check fails (a message whose fields cannot all be told
    # apart, such as "[1]"'s, named like another entry's argsrepr, met before the template was checked).
    assert len(compared) >= len(entries) - 4, f"first messages made from the shape: {compared}"
    messages = queued_messages(server.port)
    assert sorted(m["headers"]["zkbeat-entry"] for m in messages) == sorted(entries)
    for message in messages:
        name, headers = message["headers"]["zkbeat-entry"], message["headers"]
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        assert args == list(entries[name]["args"]) and kwargs == entries[name].get("kwargs", {}), name
        assert headers["argsrepr"] == saferepr(list(entries[name]["args"]) or ()), name  # as Celery writes it
        assert headers["kwargsrepr"] == saferepr(entries[name].get("kwargs", {})), name
        assert headers["id"] == message["properties"]["correlation_id"], name


def test_a_before_task_publish_receiver_that_changes_a_nested_header_is_in_every_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """A receiver that writes into a header's own dict (Celery's ``stamps``) changes the message: each tick goes
    out with what the receiver wrote for it, as through Celery, not with the bytes of the entry's first message."""
    from celery.signals import before_task_publish

    calls = iter(range(1, 1_000_000))
    entries = {f"stamped-{n}": every(1, n) for n in range(5)}

    def stamp(headers: dict | None = None, **_: Any) -> None:
        stamps = headers.get("stamps")
        if isinstance(stamps, dict):
            stamps["seq"] = next(calls)

    with connected(before_task_publish, stamp):
        scheduler = make_scheduler(entries, broker_url=redis_server.url)
        lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    messages = queued_messages(redis_server.port)
    seqs = Counter(m["headers"]["stamps"].get("seq") for m in messages)
    assert all(count == 1 for count in seqs.values()), f"messages sent with another message's stamp: {seqs}"


def test_a_before_task_publish_receiver_that_sets_a_header_where_missing_sets_it_in_every_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery builds each message's headers afresh, so ``headers.setdefault(key, value)`` in a receiver gives
    every message its own value; zkbeat's messages of one shape must too."""
    from celery.signals import before_task_publish

    calls = iter(range(1, 1_000_000))
    entries = {f"traced-{n}": every(1, n) for n in range(5)}

    def trace(headers: dict | None = None, **_: Any) -> None:
        if headers is not None:
            headers.setdefault("x-trace", next(calls))

    with connected(before_task_publish, trace):
        scheduler = make_scheduler(entries, broker_url=redis_server.url)
        lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    traces = Counter(m["headers"].get("x-trace") for m in queued_messages(redis_server.port))
    assert all(count == 1 for count in traces.values()), f"messages sent with another message's trace: {traces}"


def test_a_before_task_publish_receiver_that_adds_a_keyword_argument_has_it_in_every_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery hands ``before_task_publish`` the body it then serialises: a receiver that adds a keyword argument
    (a tenant, a request id) has it in the message Celery sends, at every tick; the entry's own kwargs stay as
    they were (Celery builds a new dict from them for each message)."""
    from celery.signals import before_task_publish

    entries = {f"tenanted-{n}": every(1, n, kwargs={"n": n}) for n in range(4)}

    def tenant(body: Any = None, **_: Any) -> None:
        if isinstance(body, (tuple, list)) and len(body) == 3 and isinstance(body[1], dict):
            body[1]["tenant"] = "acme"

    with connected(before_task_publish, tenant):
        scheduler = make_scheduler(entries, broker_url=redis_server.url)
        lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    messages = queued_messages(redis_server.port)
    missing = [
        (m["headers"]["zkbeat-entry"], m["headers"]["zkbeat-slot"])
        for m in messages
        if json.loads(base64.b64decode(m["body"]))[1].get("tenant") != "acme"
    ]
    assert not missing, f"{len(missing)} of {len(messages)} messages lack the receiver's keyword argument: {missing}"
    for name, entry in scheduler.schedule.items():
        if name in entries:
            assert entry.kwargs == {"n": entries[name]["kwargs"]["n"]}, f"{name}'s own kwargs changed: {entry.kwargs}"


def test_a_header_a_receiver_sets_on_an_entrys_first_message_only_is_in_that_message_only(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """A receiver that marks each entry's first message (and leaves the later ones alone): Celery sends the mark
    once per entry; the messages after must not be made from the marked one."""
    from celery.signals import before_task_publish

    entries = {f"marked-{n}": every(1, n) for n in range(4)}
    marked: set[str] = set()

    def mark(headers: dict | None = None, **_: Any) -> None:
        name = (headers or {}).get("zkbeat-entry")
        if name is not None and name not in marked:
            marked.add(name)
            headers["x-first"] = True  # type: ignore[index]

    with connected(before_task_publish, mark):
        scheduler = make_scheduler(entries, broker_url=redis_server.url)
        lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    firsts = Counter(
        m["headers"]["zkbeat-entry"] for m in queued_messages(redis_server.port) if "x-first" in m["headers"]
    )
    assert firsts == Counter({name: 1 for name in entries}), f"messages with the first message's mark: {firsts}"


def test_a_receivers_copy_of_plain_headers_and_body_is_a_deep_copy_as_copy_deepcopy_makes_it() -> None:
    """The receivers' copies of plain headers, properties and bodies are made by pickling: they must come out as
    ``copy.deepcopy``'s do (equal, no container shared with the shape's, a container met twice copied once);
    anything not plain (a NaN, an object, deep nesting) is left to ``copy.deepcopy``."""
    import copy
    import math

    stamps: dict = {"seq": [1, 2]}
    headers = {"id": "x", "timelimit": [None, None], "stamps": stamps, "again": stamps, "n": 1.5, "b": b"raw"}
    properties = {"correlation_id": "x", "delivery_mode": 2}
    assert batch_publish._plain_tree((headers, properties))
    fresh_headers, fresh_properties, sent = batch_publish._fresh(headers, properties, plain=True)
    expected = copy.deepcopy((headers, properties))
    assert (fresh_headers, fresh_properties) == expected
    assert batch_publish._unchanged(sent, (fresh_headers, fresh_properties))
    assert fresh_headers is not headers and fresh_properties is not properties
    assert fresh_headers["stamps"] is not stamps and fresh_headers["stamps"]["seq"] is not stamps["seq"]
    assert fresh_headers["stamps"] is fresh_headers["again"], "a container met twice must be copied once"
    fresh_headers["stamps"]["seq"].append(3)
    assert stamps == {"seq": [1, 2]}, "the receivers' copy shares a container with the shape's"
    assert not batch_publish._unchanged(sent, (fresh_headers, fresh_properties)), "a change inside a copy is unseen"

    body = (["a", 1], {"k": [1]}, {"callbacks": None})
    assert batch_publish._plain_tree(body)
    fresh, told = batch_publish._fresh_body(body, plain=True)
    assert fresh == body and fresh[1] is not body[1] and fresh[1]["k"] is not body[1]["k"]
    assert batch_publish._unchanged(told, fresh)

    class Thing:
        pass

    deep: list = []
    for _ in range(batch_publish._PLAIN_DEPTH + 1):
        deep = [deep]
    for value in ({"x": math.nan}, {"x": Thing()}, (1, {2: (3, [Thing()])}), deep, {"x": 1.0, "s": {1}}):
        assert not batch_publish._plain_tree(value), value


def test_task_ids_and_delivery_tags_are_the_uuids_python_makes() -> None:
    """A tick's task id is ``uuid.uuid5(NAMESPACE_URL, ...)`` on every replica, old or new, and a delivery tag a
    uuid4 string as kombu's ``uuid()`` makes it: the quicker formatting must give the very same strings."""
    import random
    import uuid
    from datetime import timedelta

    rng = random.Random(5)
    slot = datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc)
    for n in range(2000):
        name = "".join(rng.choice("ab-_:/ é€😀0") for _ in range(rng.randrange(0, 20)))
        root = rng.choice(["/zkbeat", "/a/b", ""])
        moment = slot + timedelta(
            seconds=rng.randrange(-(10**8), 10**8), microseconds=rng.randrange(0, 10**6) * (n % 2)
        )
        expected = str(uuid.uuid5(uuid.NAMESPACE_URL, f"zkbeat:{root}:{name}:{moment.isoformat()}"))
        assert task_id_for(root, name, moment) == expected, (root, name, moment)
        assert task_id_for(root, name, moment, moment.isoformat()) == expected
    for _ in range(2000):
        raw = bytes(rng.randrange(256) for _ in range(16))
        for version in (4, 5):
            assert batch_publish.uuid_text(raw, version) == str(uuid.UUID(bytes=raw, version=version))
        tag = batch_publish._delivery_tag()
        assert str(uuid.UUID(tag)) == tag and uuid.UUID(tag).version == 4 and uuid.UUID(tag).variant == uuid.RFC_4122


def test_an_entrys_argsrepr_follows_celerys_repr_settings_from_the_next_batch_on() -> None:
    """The argsrepr and kwargsrepr headers are Celery's ``saferepr`` under the app's settings; read once a batch,
    a change of them applies to the entries serialised in the next batch."""
    from celery import Celery
    from celery.beat import ScheduleEntry

    app = Celery("repr-settings", set_as_current=False)
    sender = batch_publish.BatchSender(app)
    shape = batch_publish._Shape(
        task="t", options={}, headers={}, properties={}, embed={}, exchange="", routing_key="celery", declare=[],
        retry_policy={}, serializer="json", priority=0, mandatory=False, own_root=True, named=(),
    )  # fmt: skip
    args, kwargs = (["x" * 40] * 30, {"deep": [[[[[1]]]]]}), {"k": "v" * 300, "n": [[[[[2]]]]]}
    entry = ScheduleEntry(name="e", task="t", args=args, kwargs=kwargs, app=app)

    def expected() -> tuple[str, str]:
        levels = app.conf.task_repr_maxlevels
        return (
            saferepr(list(args), app.amqp.argsrepr_maxsize, maxlevels=levels),
            saferepr(kwargs, app.amqp.kwargsrepr_maxsize, maxlevels=levels),
        )

    sender.new_batch()
    body = sender._serialise(entry, shape)
    assert body is not None and (body.argsrepr, body.kwargsrepr) == expected()
    app.amqp.argsrepr_maxsize, app.amqp.kwargsrepr_maxsize, app.conf.task_repr_maxlevels = 50, 60, 2
    sender.new_batch()
    body = sender._serialise(entry, shape)
    assert body is not None and (body.argsrepr, body.kwargsrepr) == expected()
    assert len(body.argsrepr) < 100, body.argsrepr


def test_a_changed_entry_goes_out_with_its_new_arguments_while_a_receiver_is_connected(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """What is kept per entry and per shape across ticks (the serialised arguments, whether they and the headers
    are plain enough to copy by pickling) is the entry's as it was: once the schedule changes the entry, every
    later message carries the new arguments and options, and the receivers are handed those."""
    from celery.signals import before_task_publish

    seen: list[tuple[str, Any, Any]] = []

    def watch(body: Any = None, headers: dict | None = None, **_: Any) -> None:
        if headers is not None and headers.get("zkbeat-entry") == "changing":
            seen.append((headers.get("x-phase"), body[0], headers.get("argsrepr")))

    with connected(before_task_publish, watch):
        scheduler = make_scheduler(
            {"changing": every(1, "a", options={"headers": {"x-phase": "one"}})}, broker_url=redis_server.url
        )
        lead_until_published(scheduler, published, ["changing"], times=2, timeout=30)
        scheduler.update_from_dict({"changing": every(1, "b", 2.5, options={"headers": {"x-phase": "two"}})})
        before = published.count("changing")
        wait_for(lambda: scheduler.tick() is not None and published.count("changing") >= before + 2, timeout=30)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    phases = [(m["headers"].get("x-phase"), json.loads(base64.b64decode(m["body"]))[0], m["headers"]["argsrepr"])
              for m in queued_messages(redis_server.port)]  # fmt: skip
    assert phases[0] == ("one", ["a"], "['a']"), phases
    assert phases[-1] == ("two", ["b", 2.5], "['b', 2.5]"), phases
    changed = phases.index(phases[-1])
    assert all(phase == phases[0] for phase in phases[:changed]), phases
    assert all(phase == phases[-1] for phase in phases[changed:]), phases
    assert seen[-1] == ("two", ["b", 2.5], "['b', 2.5]"), seen


def test_entries_whose_header_options_differ_only_in_type_each_go_out_with_their_own_value(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Shapes are shared by equality of the entries' options, and ``True == 1 == 1.0``: an entry whose header
    option is ``1`` must not go out with another entry's ``True`` (Celery writes each entry's own value)."""
    entries = {
        "typed-bool": every(1, "b", options={"headers": {"x-flag": True}}),
        "typed-int": every(1, "i", options={"headers": {"x-flag": 1}}),
        "typed-float": every(1, "f", options={"headers": {"x-flag": 1.0}}),
    }
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, entries, times=2)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = {(m["headers"]["zkbeat-entry"], repr(m["headers"]["x-flag"])) for m in queued_messages(redis_server.port)}
    assert sent == {("typed-bool", "True"), ("typed-int", "1"), ("typed-float", "1.0")}, sorted(sent)


def test_a_receiver_that_changes_an_argument_to_an_equal_value_of_another_type_has_it_in_every_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """A receiver that makes a keyword argument a float (``1`` to ``1.0``, equal to it) changes the message Celery
    sends (JSON ``1.0``, not ``1``); a change told by ``==`` misses it, and the entry's first bytes go out."""
    from celery.signals import before_task_publish

    def as_float(body: Any = None, headers: dict | None = None, **_: Any) -> None:
        if headers is not None and headers.get("zkbeat-entry") == "ratio" and isinstance(body, tuple):
            body[1]["ratio"] = float(body[1]["ratio"])

    with connected(before_task_publish, as_float):
        scheduler = make_scheduler({"ratio": every(1, kwargs={"ratio": 1})}, broker_url=redis_server.url)
        lead_until_published(scheduler, published, ["ratio"], times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    got = [repr(json.loads(base64.b64decode(m["body"]))[1]["ratio"]) for m in queued_messages(redis_server.port)]
    assert got and all(item == "1.0" for item in got), got


def test_telling_a_plain_tree_looks_at_a_shared_container_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arguments may share one container many times (pickle and ``copy.deepcopy`` copy it once): telling whether
    they are plain must not walk every path to it, or a small body that pickles in microseconds (4 ** 12 paths
    here; 10 ** 14 hangs the leader) stops the pass before anything is published."""
    shared: Any = [1]
    for _ in range(12):
        shared = [shared] * 4
    body = ([shared], {}, {"callbacks": None})
    real = batch_publish._plain_tree
    looked = 0

    def counting(value: Any, *rest: Any) -> bool:
        nonlocal looked
        looked += 1
        if looked > 10_000:
            raise AssertionError("_plain_tree walked every path to a shared container")
        return real(value, *rest)

    monkeypatch.setattr(batch_publish, "_plain_tree", counting)
    assert counting(body) is True


def test_a_receivers_change_to_an_equal_value_of_another_type_is_told_on_both_copy_paths() -> None:
    """``0`` to ``False``, ``0.0`` to ``-0.0``, ``1`` to ``1.0`` in a header or the body: equal by ``==``, not the
    same message; told on the pickled (plain) path and on ``copy.deepcopy``'s (an object among the headers)."""

    class Thing:
        def __eq__(self, other: object) -> bool:
            return type(other) is Thing

        __hash__ = object.__hash__

    changes = [("retries", 0, False), ("x-ratio", 0.0, -0.0), ("x-count", 1, 1.0), ("x-flag", True, 1)]
    for plain in (True, False):
        for name, was, now in changes:
            headers = {"id": "x", "timelimit": [None, None], name: was}
            if not plain:
                headers["x-thing"] = Thing()
            properties = {"correlation_id": "x"}
            assert batch_publish._plain_tree((headers, properties)) is plain
            fresh_headers, fresh_properties, sent = batch_publish._fresh(headers, properties, plain=plain)
            # A copied object is identical only to itself (its == may be looser than what is written for it):
            # unchanged messages with one are taken as changed, and kombu builds them, as it would.
            assert batch_publish._unchanged(sent, (fresh_headers, fresh_properties)) is plain, (plain, name)
            fresh_headers[name] = now
            assert not batch_publish._unchanged(sent, (fresh_headers, fresh_properties)), (plain, name, was, now)
            fresh_headers[name] = was
            fresh_headers["timelimit"][0] = now
            assert not batch_publish._unchanged(sent, (fresh_headers, fresh_properties)), (plain, name, was, now)

            body = ([was], {"k": was}, {"callbacks": None})
            if not plain:
                body[2]["thing"] = Thing()
            assert batch_publish._plain_tree(body) is plain
            fresh, told = batch_publish._fresh_body(body, plain=plain)
            assert batch_publish._unchanged(told, fresh) is plain, (plain, name)
            fresh[1]["k"] = now
            assert not batch_publish._unchanged(told, fresh), (plain, name, was, now)


def test_options_are_the_same_only_with_the_same_types_at_every_level() -> None:
    """Shapes are shared by entries whose options are the same value for value and type for type."""
    same = batch_publish._identical
    assert same({"headers": {"x-flag": True}, "queue": "q"}, {"headers": {"x-flag": True}, "queue": "q"})
    assert same({}, {}) and same({"n": float("nan")}, {"n": float("nan")}) and same({"s": {1, 2}}, {"s": {2, 1}})
    for a, b in [
        ({"headers": {"x-flag": True}}, {"headers": {"x-flag": 1}}),
        ({"headers": {"x-flag": 1}}, {"headers": {"x-flag": 1.0}}),
        ({"priority": 0}, {"priority": False}),
        ({"x": [0.0]}, {"x": [-0.0]}),
        ({1: "a"}, {1.0: "a"}),
        ({"s": {1}}, {"s": {True}}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # written in another order
    ]:
        assert a == b and not same(a, b) and not same(b, a), (a, b)
    cycle: list = [1]
    cycle.append(cycle)
    other: list = [1]
    other.append(other)
    assert same({"c": cycle}, {"c": other})
    shared: Any = [1]
    for _ in range(40):
        shared = [shared, shared]  # 2 ** 40 paths: compared once per container
    assert same(shared, copy_of(shared))


def copy_of(value: Any) -> Any:
    import pickle

    return pickle.loads(pickle.dumps(value))


def test_an_after_task_publish_receivers_change_to_a_message_is_in_no_later_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery hands ``after_task_publish`` each message's own body and headers: a receiver that writes into them
    (the embed's ``chain``, the ``timelimit`` list) changes nothing that is sent later, for this entry or another
    entry of the same shape."""
    from celery.signals import after_task_publish

    def scribble(body: Any = None, headers: dict | None = None, **_: Any) -> None:
        if isinstance(body, tuple) and len(body) == 3 and isinstance(body[2], dict):
            body[2]["chain"] = [{"task": "leaked"}]
            body[1]["leaked"] = True
        if headers is not None and isinstance(headers.get("timelimit"), list):
            headers["timelimit"][0] = 99

    with connected(after_task_publish, scribble):
        scheduler = make_scheduler({"first": every(1, 1)}, broker_url=redis_server.url)
        lead_until_published(scheduler, published, ["first"], times=2)
        scheduler.update_from_dict({"later": every(1, 2)})
        wait_for(lambda: scheduler.tick() is not None and published.count("later") >= 2, timeout=60)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    messages = queued_messages(redis_server.port)
    bodies = [(m["headers"]["zkbeat-entry"], json.loads(base64.b64decode(m["body"]))) for m in messages]
    leaked = [(name, body) for name, body in bodies if body[2].get("chain") or "leaked" in body[1]]
    assert not leaked, leaked
    limits = [(m["headers"]["zkbeat-entry"], m["headers"]["timelimit"]) for m in messages]
    assert all(limit == [None, None] for _, limit in limits), limits


def test_an_entrys_own_argsrepr_and_kwargsrepr_go_out_in_every_message_as_celery_writes_them(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery writes an ``argsrepr``/``kwargsrepr`` option (arguments kept out of logs) as given, and a header of
    the entry's ``headers`` option over its own: every tick's message must carry them, not ``saferepr`` of the
    arguments."""
    entries = {
        "repr-option": every(1, "secret-a", options={"argsrepr": "<hidden>", "kwargsrepr": "<none>"}),
        "repr-header": every(1, "secret-b", options={"headers": {"argsrepr": "<masked>"}}),
    }
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = Counter(
        (m["headers"]["zkbeat-entry"], m["headers"]["argsrepr"], m["headers"]["kwargsrepr"])
        for m in queued_messages(redis_server.port)
    )
    assert set(sent) == {("repr-option", "<hidden>", "<none>"), ("repr-header", "<masked>", "{}")}, sent


def test_an_id_and_root_id_header_option_go_out_in_every_message_as_celery_writes_them(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery writes the entry's ``headers`` option over its own headers, ``id`` and ``root_id`` included: every
    tick's message must carry the option's values, as Celery's does."""
    entries = {"header-id": every(1, 1, options={"headers": {"id": "fixed-id", "root_id": "fixed-id"}})}
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, ["header-id"], times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = Counter((m["headers"]["id"], m["headers"]["root_id"]) for m in queued_messages(redis_server.port))
    assert set(sent) == {("fixed-id", "fixed-id")}, sent


def test_a_zkbeat_option_in_the_headers_that_holds_the_entrys_own_name_is_in_no_message(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """zkbeat's own options are taken out of the entry's ``headers`` option before Celery builds the message
    (a django-celery-beat row sets them there): one whose value happens to be the entry's name (an entry named
    ``once``) is in none of its messages either."""
    entries = {"once": every(1, 1, options={"headers": {"zkbeat_catchup": "once", "x-team": "a"}})}
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, ["once"], times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    messages = queued_messages(redis_server.port)
    assert len(messages) >= 3
    carrying = [m["headers"]["id"] for m in messages if "zkbeat_catchup" in m["headers"]]
    assert carrying == [], f"{len(carrying)} of {len(messages)} messages carry the zkbeat_catchup header"


def test_a_before_task_publish_receiver_gets_each_messages_own_declare_list(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """Celery hands the receivers a ``declare`` list of each message's own (``[queue]``): what a receiver adds
    to it is in that message's declarations only, never in another message's (nor kept for the term's life)."""
    from celery.signals import before_task_publish
    from kombu import Queue

    entries = {f"declaring-{n}": every(1, n) for n in range(3)}
    lengths: list[int] = []

    def declare_more(declare: list | None = None, **_: Any) -> None:
        if declare is not None:
            lengths.append(len(declare))
            declare.append(Queue("zkbeat-extra"))

    with connected(before_task_publish, declare_more):
        scheduler = make_scheduler(entries, broker_url=redis_server.url)
        lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    assert set(lengths) == {1}, f"receivers handed declare lists of lengths {Counter(lengths)}"


def test_entries_whose_link_options_differ_only_in_an_arguments_type_each_go_out_with_their_own_callback(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """A ``link`` option is a Signature, a dict of its own type that ``==`` compares as a dict (``True == 1``):
    an entry whose callback's argument is ``1`` must not go out with another entry's ``True`` (Celery writes
    each entry's own callback in its message's body)."""
    from celery import signature

    entries = {
        "linked-bool": every(1, "b", options={"link": signature("zkbeat.tests.callback", args=(True,))}),
        "linked-int": every(1, "i", options={"link": signature("zkbeat.tests.callback", args=(1,))}),
    }
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, entries, times=3)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = Counter(
        (m["headers"]["zkbeat-entry"], repr(json.loads(base64.b64decode(m["body"]))[2]["callbacks"][0]["args"]))
        for m in queued_messages(redis_server.port)
    )
    assert set(sent) == {("linked-bool", "[True]"), ("linked-int", "[1]")}, sent


def test_entries_whose_header_options_are_equal_decimals_written_differently_each_go_out_with_their_own(
    make_scheduler, redis_server: RedisServer, published: Published
) -> None:
    """``Decimal("1.0") == Decimal("1.00")``, but kombu writes a Decimal as its text: each entry's message
    carries its own header value, as Celery writes it."""
    from decimal import Decimal

    entries = {
        "decimal-short": every(1, "s", options={"headers": {"x-price": Decimal("1.0")}}),
        "decimal-long": every(1, "l", options={"headers": {"x-price": Decimal("1.00")}}),
    }
    scheduler = make_scheduler(entries, broker_url=redis_server.url)
    lead_until_published(scheduler, published, entries, times=2)
    assert scheduler.term.publisher.batch is not None, "the ticks did not go through the pipeline path"
    sent = Counter(
        (m["headers"]["zkbeat-entry"], json.dumps(m["headers"]["x-price"])) for m in queued_messages(redis_server.port)
    )
    assert {entry for entry, price in sent if "1.00" in price} == {"decimal-long"}, sent
