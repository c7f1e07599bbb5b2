"""A term runs on what it is given (zkbeat.leading.host), with no zkbeat scheduler behind it.

Real ZooKeeper and Redis; the schedule is a plain dict and the broker side
Celery's own beat scheduler. What the term claims lands in the ledger, what
it publishes reaches the broker, and every entry it advances or leaves out
goes through the hooks it was handed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, beat
from kazoo.client import KazooClient

from tests.support.helpers import Published, every
from tests.support.servers import RedisServer, ZooKeeperServer
from zkbeat.conf import read_settings
from zkbeat.coordination.election import Fence
from zkbeat.leading.broker import forget
from zkbeat.leading.host import BeatBroker, Collaborators, ScheduleView
from zkbeat.leading.publisher import Publisher
from zkbeat.leading.term import Due, Term
from zkbeat.ledger.store import Ledger
from zkbeat.ops.metrics import Metrics
from zkbeat.ticking.jitter import Jitter
from zkbeat.ticking.policy import Policies


class Hooks:
    """A host of the plainest kind: a dict of entries, and a record of what the term asked of it."""

    def __init__(self, schedule: dict[str, beat.ScheduleEntry]) -> None:
        self.schedule = schedule
        self.reserved: list[str] = []
        self.left_out: list[tuple[str, str]] = []
        self.invalidated = 0

    def reserve(self, entry: beat.ScheduleEntry) -> beat.ScheduleEntry:
        self.reserved.append(entry.name)
        successor = self.schedule[entry.name] = next(entry)
        return successor

    def leave_out(self, entry: beat.ScheduleEntry, exc: BaseException) -> None:
        self.left_out.append((entry.name, type(exc).__name__))

    def invalidate(self) -> None:
        self.invalidated += 1

    def view(self) -> ScheduleView:
        return ScheduleView(
            read=lambda: self.schedule,
            reserve=self.reserve,
            ask=lambda entry: (*entry.is_due(), True),
            leave_out=self.leave_out,
            invalidate_heap=self.invalidate,
            keeps_own_run=lambda entry, state: False,
            loaded=lambda: True,
        )


@pytest.fixture
def celery_beat(redis_server: RedisServer) -> Iterator[beat.Scheduler]:
    """Celery's own scheduler on the shared Redis: beat's connection, producer and apply_async, nothing of zkbeat's."""
    app = Celery("zkbeat-test", set_as_current=False)
    app.conf.broker_url = redis_server.url
    host = beat.Scheduler(app, lazy=True)
    try:
        yield host
    finally:
        forget(host)


def test_a_term_claims_and_publishes_with_only_its_collaborators(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, celery_beat: beat.Scheduler, published: Published
) -> None:
    settings = read_settings(
        {"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "zkbeat_identity": "alone"}, None
    )
    app = celery_beat.app
    # Due at once (never run), and one whose name cannot be a znode: left out through the hook.
    schedule = {name: beat.ScheduleEntry(name=name, app=app, **every(60)) for name in ("tidy", "")}
    hooks = Hooks(schedule)
    policies = Policies(settings)
    parts = Collaborators(
        ledger=Ledger(zk_client, settings.root),
        view=hooks.view(),
        settings=settings,
        policies=policies,
        jitter=Jitter(settings.root, settings.jitter, policies),
        metrics=Metrics(settings),
        max_interval=5.0,
    )
    broker = BeatBroker(
        app=app,
        connection=lambda: celery_beat.connection,
        made_connection=lambda: celery_beat.__dict__.get("connection"),
        producer=lambda: celery_beat.producer,
        forget=lambda: forget(celery_beat),
        apply_async=celery_beat.apply_async,
    )
    candidate = zk_client.create(f"{zk_root}/fence", b"", ephemeral=True, makepath=True)
    fence = Fence(epoch=7, candidate=candidate)
    publisher = Publisher(broker, settings, parts.metrics, parts.max_interval, fence.epoch)

    term = Term.begin(parts, publisher, fence)
    first = schedule["tidy"]
    requeue = term.run([Due(entry, 5 + i, 0.0) for i, entry in enumerate(list(schedule.values()))])

    assert published.entries() == ["tidy"]
    assert published.headers[0]["zkbeat-epoch"] == 7
    record = parts.ledger.load(["tidy"])["tidy"]
    assert record.state.epoch == 7 and record.state.total_run_count == 1
    # Advanced through the host's reserve(), and put back on the heap as the successor.
    assert hooks.reserved == ["tidy"]
    assert schedule["tidy"] is not first and schedule["tidy"].total_run_count == 1
    back: dict[str, Any] = {item.entry.name: item for item in requeue}
    assert back["tidy"].entry is schedule["tidy"]
    assert back[""].delay == parts.max_interval
    assert hooks.left_out == [("", "ValueError")]
