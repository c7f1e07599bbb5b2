"""Run-now requests claimed in parts, the broker gone while part one goes out.

A pass's run-now ticks are claimed in parts (zkbeat.leading.term.CLAIM_PART)
as the scheduled ones are, each claim consuming its requests. When the
broker goes away while part one's messages go out, part one and part two
(claimed meanwhile) are written back with their requests put back in the
inbox, and the parts after them are never claimed: their requests stay in
the inbox, and all are read again after RETRY_DELAY (as a withdrawn
scheduled tick is tried again), not at once. Once the broker is back every
request runs exactly once, the inbox is empty, and no scheduled tick of
those entries goes out twice: with the broker's failure played by the
test, and with a real Redis behind a proxy that resets and refuses.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from kombu.exceptions import OperationalError

from tests.support.helpers import Published, every, lead, wait_for
from tests.support.messages import queued_messages
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer
from tests.test_claim_parts import claims_sent, versions
from zkbeat.leading import publisher as publisher_module
from zkbeat.leading import term as term_module
from zkbeat.ledger import controls
from zkbeat.ledger.store import Ledger, decode_state
from zkbeat.ticking.ticks import HEADER_MANUAL, manual_task_id

PART = 2
NAMES = [f"r{i}" for i in range(6)]  # one request each: parts of 2, 2 and 2


class BrokerGone:
    """The broker goes away as the ``at``-th run-now message is sent, and stays away until :meth:`back`.

    While it is away a send fails as one that found the broker gone does
    (nothing sent, ``broker_down``), and the wait for it before a pass's
    claims (zkbeat.leading.broker.wait_for_broker) gives up, unless it
    ``connects``: a broker that takes connections and fails every send.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int = 1, connects: bool = False) -> None:
        self.down = False
        self.went = False  # it goes once
        self.at = at
        self.tried: list[str] = []  # run-now messages tried, by entry
        self.waited: list[int] = []  # ticks waiting for it, each time a pass found it away
        real_publish = publisher_module.Publisher.publish
        real_publish_many = publisher_module.Publisher.publish_many
        real_wait = publisher_module.wait_for_broker
        real_producer = publisher_module.Publisher.producer

        def publish(publisher, entry, slot, producer, request=None):
            if request is not None and not self.down and not self.went:
                self.tried.append(entry.name)
                self.down = self.went = len(self.tried) >= self.at
            if self.down:
                publisher.broker_down = True
                return False
            return real_publish(publisher, entry, slot, producer, request)

        def publish_many(publisher, sends, producer, writing):
            if self.down:
                publisher.broker_down = True
                return [False] * len(sends)
            return real_publish_many(publisher, sends, producer, writing)

        def wait_for_broker(connection, timeout, errback=None):
            if self.down and not connects:
                return OperationalError("the broker is gone (test)")
            return real_wait(connection, timeout, errback)

        def producer(publisher, waiting):
            if self.down:
                self.waited.append(waiting)
            return real_producer(publisher, waiting)

        monkeypatch.setattr(publisher_module.Publisher, "producer", producer)
        monkeypatch.setattr(publisher_module.Publisher, "publish", publish)
        monkeypatch.setattr(publisher_module.Publisher, "publish_many", publish_many)
        monkeypatch.setattr(publisher_module, "wait_for_broker", wait_for_broker)

    def back(self) -> None:
        self.down = False


@pytest.fixture(autouse=True)
def parts_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(term_module, "CLAIM_PART", PART)


def request_each(zk_client, zk_root: str, names: list[str] = NAMES) -> dict[str, str]:
    """One run-now request for each entry, all waiting before the leader's next pass: request name -> entry."""
    made = {}
    for name in names:
        path = controls.request_trigger(zk_client, zk_root, name, "ops@bastion", scheduled=True)
        made[path.rsplit("/", 1)[1]] = name
    return made


def inbox(zk_client, zk_root: str) -> list[str]:
    """The requests waiting in the inbox, by name."""
    return sorted(r["request"] for r in controls.pending_requests(zk_client, zk_root))


def manual_runs(published: Published) -> list[tuple[str, str, str]]:
    """(request, entry, task id) of every run-now published."""
    return [(h[HEADER_MANUAL], h["zkbeat-entry"], h.get("id")) for h in published.headers if h.get(HEADER_MANUAL)]


def scheduled_runs(published: Published) -> list[tuple[str, str]]:
    """(entry, slot) of every scheduled tick published."""
    return [(h["zkbeat-entry"], h["zkbeat-slot"]) for h in published.headers if not h.get(HEADER_MANUAL)]


def ledger_state(zk_client, zk_root: str, name: str):
    raw, _ = zk_client.get(Ledger(zk_client, zk_root).entry_path(name))
    return decode_state(raw)


def the_broken_pass(scheduler, gone: BrokerGone, claims: list, zk_client) -> list[str]:
    """The leader's pass that finds the requests, the broker gone in part one; the names of the part never claimed.

    Parts one and two are claimed (two's while one goes out) and written back;
    part three is never claimed.
    """
    wait_for(lambda: scheduler.tick() is not None and gone.down, timeout=15, message=lambda: f"tried {gone.tried}")
    sent = [names for kind, names in claims if kind == "claim"]
    first, second = sent[0], sent[1]
    assert [len(first), len(second)] == [PART, PART], sent
    third = [name for name in NAMES if name not in first and name not in second]
    assert len(third) == PART, sent
    # after the two parts only their write-back: never part three
    assert all(set(names) <= set(first) | set(second) for names in sent[2:]), f"part three was claimed: {sent}"
    assert versions(zk_client, scheduler.ledger, third) == dict.fromkeys(third), "part three's entries were written"
    assert scheduler.term is not None and scheduler.term.pending == {}, "the claimed parts were not written back"
    return third


def while_gone(scheduler, claims: list, zk_client, zk_root: str, passes: int = 3) -> None:
    """More passes while the broker is away: nothing claimed, the inbox as it was."""
    waiting, count = inbox(zk_client, zk_root), len(claims)
    for _ in range(passes):
        scheduler.tick()
    assert claims[count:] == [], f"claimed while the broker was away: {claims[count:]}"
    assert inbox(zk_client, zk_root) == waiting


def all_once(published: Published, requests: dict[str, str], zk_client, zk_root: str) -> None:
    """Every request published once, under its entry and its own task id; the inbox empty; each one's fate told."""
    runs = manual_runs(published)
    counted = Counter(request for request, _, _ in runs)
    assert counted == Counter(list(requests)), f"run-now messages per request: {dict(counted)}"
    for request, entry, task_id in runs:
        assert entry == requests[request], (request, entry)
        assert task_id == manual_task_id(zk_root, entry, request)
    assert inbox(zk_client, zk_root) == [], "a request is stuck in the inbox"
    for request, entry in requests.items():
        assert ledger_state(zk_client, zk_root, entry).manual == request, f"{request}'s run is not recorded"
        outcome = controls.request_outcome(zk_client, zk_root, request, entry)
        assert outcome["state"] == "published", (request, outcome)
        assert outcome["receipt"]["task_id"] == manual_task_id(zk_root, entry, request)


def pump(scheduler, until, state) -> None:
    """Run the leader's passes until ``until()`` holds, then a few more (a second publish would show in them)."""
    wait_for(lambda: scheduler.tick() is not None and until(), timeout=20, message=state)
    for _ in range(3):
        scheduler.tick()


def back_and_each_request_run_once(
    scheduler, gone: BrokerGone, published: Published, requests: dict[str, str], zk_client, zk_root: str,
    also=lambda: True, claims: list | None = None,
) -> None:  # fmt: skip
    """The broker back: the leader's passes until every request ran (and ``also``); then each ran once."""
    gone.back()
    pump(
        scheduler,
        lambda: len(manual_runs(published)) >= len(requests) and also(),
        lambda: f"published {published.rows}, waiting {inbox(zk_client, zk_root)}, claims {claims}",
    )
    all_once(published, requests, zk_client, zk_root)


@pytest.mark.parametrize("at", [1, 2], ids=["at-its-first-message", "at-its-second-message"])
def test_run_now_requests_in_parts_the_broker_gone_in_part_one_each_run_once_when_it_is_back(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    """Six requests in one pass (three parts): none lost while the broker is away, each run once once it is back."""
    scheduler = make_scheduler({name: every(3600) for name in NAMES})  # not due for an hour: run-now only
    lead(scheduler)
    scheduler.tick()
    claims = claims_sent(scheduler.ledger, monkeypatch)
    gone = BrokerGone(monkeypatch, at)
    requests = request_each(zk_client, zk_root)

    third = the_broken_pass(scheduler, gone, claims, zk_client)
    went = [entry for _, entry, _ in manual_runs(published)]
    assert went == gone.tried[: at - 1], f"went out before the broker went: {went}"
    assert set(went).isdisjoint(third)
    assert inbox(zk_client, zk_root) == sorted(r for r, entry in requests.items() if entry not in went), (
        "a request neither run nor back in the inbox"
    )
    while_gone(scheduler, claims, zk_client, zk_root)

    back_and_each_request_run_once(scheduler, gone, published, requests, zk_client, zk_root, claims=claims)
    assert scheduled_runs(published) == []


def test_run_now_requests_and_scheduled_ticks_of_one_pass_the_broker_gone_in_part_one_each_go_out_once(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every entry due and asked to run now in the same pass: the broker goes at the first run-now message and
    stays away for the scheduled ticks; once back, each request runs once and each entry's tick goes out once."""
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    scheduler = make_scheduler({name: every(3600, last_run_at=long_ago) for name in NAMES})
    lead(scheduler)
    claims = claims_sent(scheduler.ledger, monkeypatch)
    gone = BrokerGone(monkeypatch)
    requests = request_each(zk_client, zk_root)  # waiting before the leader's first pass, as its entries are

    the_broken_pass(scheduler, gone, claims, zk_client)
    assert gone.waited == [len(NAMES)], f"the scheduled ticks were not in that pass: {gone.waited}"
    assert published.headers == []
    assert inbox(zk_client, zk_root) == sorted(requests)
    while_gone(scheduler, claims, zk_client, zk_root)

    back_and_each_request_run_once(
        scheduler, gone, published, requests, zk_client, zk_root, lambda: len(scheduled_runs(published)) >= 6, claims
    )
    ticks = scheduled_runs(published)
    assert Counter(entry for entry, _ in ticks) == Counter(NAMES), f"scheduled ticks: {ticks}"
    assert len(set(ticks)) == len(ticks), f"a scheduled tick went out twice: {ticks}"
    for name in NAMES:
        assert ledger_state(zk_client, zk_root, name).total_run_count == 1, f"{name}: a run-now counted as a run"


def test_the_requests_a_pass_put_back_are_read_again_though_no_watch_event_says_so(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader itself asks its inbox to read the requests of the part never claimed again (Term._not_claimed).

    In a run the consume of parts one and two fires the inbox's watch too;
    here that watch tells nothing from the broken pass on, so the requests
    come back only because the pass said so.
    """
    scheduler = make_scheduler({name: every(3600) for name in NAMES})
    lead(scheduler)
    scheduler.tick()
    claims = claims_sent(scheduler.ledger, monkeypatch)
    gone = BrokerGone(monkeypatch)
    requests = request_each(zk_client, zk_root)  # the watch set before fires for these
    monkeypatch.setattr(controls.TriggerInbox, "_on_change", lambda self, event: None)  # the watches set from now on

    the_broken_pass(scheduler, gone, claims, zk_client)
    assert published.headers == [] and inbox(zk_client, zk_root) == sorted(requests)
    back_and_each_request_run_once(scheduler, gone, published, requests, zk_client, zk_root, claims=claims)


@pytest.mark.parametrize("count", [PART, len(NAMES)], ids=["one-part-written-back", "and-a-part-never-claimed"])
def test_run_now_requests_the_broker_could_not_take_are_not_claimed_again_before_the_retry_delay(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """A broker that takes connections and fails every send: the requests put back wait RETRY_DELAY, as a scheduled
    tick withdrawn so waits, instead of being claimed, withdrawn and read again in every pass, at once."""
    monkeypatch.setattr(term_module, "RETRY_DELAY", 3600.0)  # longer than the test: any claim after is too soon
    scheduler = make_scheduler({name: every(3600) for name in NAMES})
    lead(scheduler)
    scheduler.tick()
    claims = claims_sent(scheduler.ledger, monkeypatch)
    gone = BrokerGone(monkeypatch, connects=True)
    requests = request_each(zk_client, zk_root, NAMES[:count])

    wait_for(lambda: scheduler.tick() is not None and gone.down, timeout=15)
    assert claims, "nothing was claimed"
    while_gone(scheduler, claims, zk_client, zk_root)
    assert published.headers == [] and inbox(zk_client, zk_root) == sorted(requests)


def test_with_a_real_redis_gone_in_part_one_each_run_now_and_each_scheduled_tick_is_queued_once(
    make_scheduler,
    proxied_redis: tuple[RedisServer, TcpProxy],
    published: Published,
    zk_client,
    zk_root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mixed pass again, the broker really gone: the proxy resets the leader's connection and refuses new ones
    just before the first run-now message is written. What reached Redis is read past the proxy: each run-now and
    each entry's tick in the queue once."""
    server, proxy = proxied_redis
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    scheduler = make_scheduler(
        {name: every(3600, last_run_at=long_ago) for name in NAMES}, broker_url=f"redis://127.0.0.1:{proxy.port}/0"
    )
    lead(scheduler)
    claims = claims_sent(scheduler.ledger, monkeypatch)
    real_publish = publisher_module.Publisher.publish
    tried: list[str] = []

    def publish(publisher, entry, slot, producer, request=None):
        if request is not None and not tried:
            proxy.reset()
            wait_for(lambda: not proxy._reset_requested and not proxy._pairs, message="the proxy never reset")
        tried.append(entry.name)
        return real_publish(publisher, entry, slot, producer, request)

    monkeypatch.setattr(publisher_module.Publisher, "publish", publish)
    requests = request_each(zk_client, zk_root)
    wait_for(lambda: scheduler.tick() is not None and bool(tried), timeout=15)
    sent = [names for kind, names in claims if kind == "claim"]
    first, second = sent[0], sent[1]
    assert all(set(names) <= set(first) | set(second) for names in sent[2:]), f"claimed with Redis gone: {sent}"
    assert published.headers == [] and inbox(zk_client, zk_root) == sorted(requests)
    while_gone(scheduler, claims, zk_client, zk_root, passes=2)

    proxy.heal()
    pump(
        scheduler,
        lambda: len(manual_runs(published)) >= len(requests) and len(scheduled_runs(published)) >= len(NAMES),
        lambda: f"published {published.rows}, waiting {inbox(zk_client, zk_root)}, claims {claims}",
    )
    all_once(published, requests, zk_client, zk_root)
    queued = [message["headers"] for message in queued_messages(server.port, "celery")]
    ids = [headers["id"] for headers in queued]
    assert len(ids) == len(set(ids)) == 2 * len(NAMES), f"queued: {[(h['zkbeat-entry'], h['id']) for h in queued]}"
    assert sorted(h[HEADER_MANUAL] for h in queued if h.get(HEADER_MANUAL)) == sorted(requests)
    assert Counter(h["zkbeat-entry"] for h in queued if not h.get(HEADER_MANUAL)) == Counter(NAMES)
