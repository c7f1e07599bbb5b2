"""RabbitMQ with and without publisher confirms: what a returned publish means, and a refused message.

An in-process leader publishes to the machine's RabbitMQ, in a vhost of the
test's own behind a proxy (tests/support/brokers.py); the test looks into the
broker past the proxy. With ``confirm_publish`` a publish returns only once
the broker has the message, and a message the broker refuses (a full queue
with ``x-overflow: reject-publish``) is nacked: the leader logs it, counts the
tick as run and keeps leading, since a refusal is not an outage. Without
confirms the same message is lost silently, as is one handed to the socket
while the broker cannot take it: the two limits docs/guarantees.md states.
With confirms and a ``confirm_timeout``, an ack that never comes on a cut
link leaves the tick uncertain: it may have arrived, so it is not sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import celery
import pytest
from amqp.exceptions import NotFound
from kombu import Connection, Exchange, Queue

from tests.support.brokers import RabbitBroker
from tests.support.helpers import Published, every, lead, wait_for
from zkbeat.leading.publisher import HAS_CONFIRM_TIMEOUT

CONFIRMS = {"broker_transport_options": {"confirm_publish": True}}
needs_confirm_timeout = pytest.mark.skipif(
    not HAS_CONFIRM_TIMEOUT, reason=f"confirm_timeout needs Celery 5.5 (this is {celery.__version__})"
)
#: Route an entry to the test's small queue instead of Celery's default one.
TO_FULL = {"exchange": "full", "routing_key": "full"}


@pytest.fixture
def rabbit(request: pytest.FixtureRequest) -> Iterator[RabbitBroker]:
    """A vhost of this test's own on the machine's RabbitMQ, deleted afterwards."""
    with RabbitBroker(request.node.name) as broker:
        yield broker


def declare_full_queue(rabbit: RabbitBroker, filler: int = 1) -> None:
    """Declare the queue ``full`` (at most one message, refuses more) and put ``filler`` messages in it."""
    queue = Queue(
        "full",
        Exchange("full", "direct"),
        "full",
        queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    with Connection(rabbit.direct_url) as connection:
        queue(connection.default_channel).declare()
        producer = connection.Producer()
        for _ in range(filler):
            producer.publish({"filler": True}, exchange="full", routing_key="full", headers={"zkbeat-slot": "filler"})


def drain(rabbit: RabbitBroker, queue: str) -> list[dict[str, Any]]:
    """Take every message out of ``queue``; their headers, in queue order."""
    headers = []
    with Connection(rabbit.direct_url) as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            headers.append(dict(message.headers or {}))
    return headers


def depth(rabbit: RabbitBroker, queue: str) -> int:
    """Messages in ``queue`` now; 0 while nothing has declared it yet."""
    with Connection(rabbit.direct_url) as connection:
        try:
            return connection.default_channel.queue_declare(queue, passive=True).message_count
        except NotFound:
            return 0


def dropped_lines(caplog: pytest.LogCaptureFixture, entry: str) -> list[str]:
    lines = [r.getMessage() for r in caplog.records]
    return [line for line in lines if f"{entry} (slot" in line and "dropped" in line]


def test_with_confirms_a_publish_that_returned_is_on_the_broker(
    make_scheduler, rabbit: RabbitBroker, published: Published
) -> None:
    """With confirm_publish, each time tick() returns every message it published is already in the queue."""
    scheduler = make_scheduler({"tidy": every(0.2)}, broker_url=rabbit.url, **CONFIRMS)
    lead(scheduler)
    seen = []
    while len(published.headers) < 5:
        wait_for(lambda: scheduler.tick() is not None, timeout=10)
        seen.append((len(published.headers), depth(rabbit, "celery")))
    assert all(sent == queued for sent, queued in seen), seen
    slots = [h["zkbeat-slot"] for h in drain(rabbit, "celery")]
    assert slots == [h["zkbeat-slot"] for h in published.headers]


def test_with_confirms_a_refused_message_is_logged_counted_as_run_and_not_an_outage(
    make_scheduler, rabbit: RabbitBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A full reject-publish queue nacks the tick: logged once, counted as run, the batch and leadership unharmed."""
    declare_full_queue(rabbit)
    scheduler = make_scheduler(
        {"refused": every(0.3, options=TO_FULL), "fine": every(0.3)}, broker_url=rabbit.url, **CONFIRMS
    )
    lead(scheduler)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and len(dropped_lines(caplog, "refused")) >= 3,
            timeout=30,
            message=lambda: caplog.text,
        )
        refused = dropped_lines(caplog, "refused")
        assert not [r for r in caplog.records if "unreachable" in r.getMessage() or "written back" in r.getMessage()]
        state = scheduler.ledger.load(["refused", "fine"])
        assert state["refused"].state.total_run_count == len(refused), "each refused tick counts as run, once"
        assert state["fine"].state.total_run_count == published.count("fine"), "every claimed fine tick went out"
        assert scheduler.election.is_leader, "a refusal must not cost leadership"

        # Room in the queue again: the next tick goes in, no refused one is sent again.
        assert [h["zkbeat-slot"] for h in drain(rabbit, "full")] == ["filler"]
        wait_for(lambda: scheduler.tick() is not None and published.count("refused") >= 1, timeout=10)
    nacked_slots = {line.split("(slot ", 1)[1].split(")", 1)[0] for line in dropped_lines(caplog, "refused")}
    in_queue = [h["zkbeat-slot"] for h in drain(rabbit, "full")]
    assert len(in_queue) == 1 and in_queue[0] not in nacked_slots
    fine = [h["zkbeat-slot"] for h in drain(rabbit, "celery")]
    assert len(fine) == len(set(fine)) == published.count("fine"), "nothing doubled"


def test_without_confirms_a_refused_message_is_lost_silently(
    make_scheduler, rabbit: RabbitBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """Without confirms the same full queue drops the tick and the leader believes it was published."""
    declare_full_queue(rabbit)
    scheduler = make_scheduler({"refused": every(0.3, options=TO_FULL)}, broker_url=rabbit.url)
    lead(scheduler)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and published.count("refused") >= 3, timeout=20)
    assert dropped_lines(caplog, "refused") == []
    assert [h["zkbeat-slot"] for h in drain(rabbit, "full")] == ["filler"], "the broker dropped every tick"


def test_without_confirms_a_message_handed_to_a_cut_link_is_lost(
    make_scheduler, rabbit: RabbitBroker, published: Published
) -> None:
    """Without confirms a publish into a black-holed link returns as sent; the broker never gets it."""
    scheduler = make_scheduler({"tidy": every(0.2)}, broker_url=rabbit.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 2, timeout=10)
    wait_for(lambda: depth(rabbit, "celery") == len(published.headers), timeout=10)
    rabbit.proxy.blackhole()
    before, dropped = len(published.headers), rabbit.proxy.dropped
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) > before, timeout=10)
    lost = [h["zkbeat-slot"] for h in published.headers[before:]]
    wait_for(lambda: rabbit.proxy.dropped > dropped, timeout=10, message="the proxy never saw the publish")
    rabbit.proxy.heal()  # the connection that lost bytes is reset, as TCP would give up on it
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(lost) + before + 2, timeout=20)
    queued = [h["zkbeat-slot"] for h in drain(rabbit, "celery")]
    assert not set(lost) & set(queued), "the ticks sent into the cut link never reached the queue"
    assert set(queued) == {h["zkbeat-slot"] for h in published.headers} - set(lost)


def test_a_nack_arrives_wrapped_and_is_not_taken_for_an_outage(rabbit: RabbitBroker) -> None:
    """A nacked publish raises OperationalError from MessageNacked, a recoverable error; is_broker_error says no."""
    from amqp.exceptions import MessageNacked
    from celery import Celery
    from kombu.exceptions import OperationalError

    from zkbeat.leading.broker import _chain, is_broker_error

    declare_full_queue(rabbit)
    app = Celery("nack", set_as_current=False)
    app.conf.update(broker_url=rabbit.url, **CONFIRMS)
    with app.connection_for_write() as connection, pytest.raises(OperationalError) as raised:
        app.send_task("nack.t", exchange="full", routing_key="full", connection=connection)
    kinds = [type(exc) for exc in _chain(raised.value)]
    assert kinds == [OperationalError, MessageNacked]
    with app.connection_for_write() as connection:
        assert MessageNacked in connection.recoverable_connection_errors, "why the chain must be read, not the types"
        assert not is_broker_error(raised.value, connection)


@needs_confirm_timeout
def test_with_confirms_and_a_confirm_timeout_a_cut_link_costs_that_tick_once_and_never_doubles(
    make_scheduler, rabbit: RabbitBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """An ack that does not come on a black-holed link times out: the tick may have arrived, so it is not sent again.

    Here the black hole dropped it, so that one tick is lost, and the log
    names it with its task id; had only the ack been lost
    (tests/test_uncertain_publish.py), sending it again would double it.
    """
    scheduler = make_scheduler({"tidy": every(0.3, options={"confirm_timeout": 1})}, broker_url=rabbit.url, **CONFIRMS)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 2, timeout=10)
    rabbit.proxy.blackhole()
    before = len(published.headers)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and "got no answer" in caplog.text,
            timeout=60,
            message=lambda: caplog.text,
        )
        assert len(published.headers) == before, "nothing counts as published without its ack"
        rabbit.proxy.heal()
        wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= before + 2, timeout=30)
    (line,) = [r.getMessage() for r in caplog.records if "got no answer" in r.getMessage()]
    lost = line.split("(slot ", 1)[1].split(",", 1)[0]
    assert "reachable again" in caplog.text
    assert scheduler.election.is_leader
    queued = [h["zkbeat-slot"] for h in drain(rabbit, "celery")]
    sent = [h["zkbeat-slot"] for h in published.headers]
    assert queued == sent and len(set(sent)) == len(sent), "each tick in the queue once"
    assert lost not in queued, "the black hole took it, and it was not sent again"
    assert scheduler.ledger.load(["tidy"])["tidy"].state.total_run_count == len(sent) + 1, "it counts as run"
