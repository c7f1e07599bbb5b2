"""What a hostile reading of the core found, in-process against real ZooKeeper
and Redis: conflicts, clocks that raise, names the ledger cannot hold, claims
whose reply was lost on a replica that then stops, entries someone else made
read-only, and ZooKeeper or the broker going silent mid-batch."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import schedule
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.security import ACL, Id, Permissions, make_digest_acl
from kombu.exceptions import OperationalError

from tests.support.helpers import Published, every, intercept_claims, lead, stop_intercepting, wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.support.signals import Terminated, sigterm_raises
from zkbeat.ledger.store import Claim, EntryState, Ledger, encode_state


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def run_for(scheduler, seconds: float) -> list[float]:
    """Beat's loop for ``seconds``: tick, then sleep what tick asked (at most 0.5 s), as beat would."""
    returns = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        returns.append(scheduler.tick())
        time.sleep(min(returns[-1], 0.5))
    return returns


def seed(zk_client: KazooClient, root: str, name: str, last_run_at: datetime) -> None:
    ledger = Ledger(zk_client, root)
    ledger.ensure()
    fence = zk_client.create(f"{root}/seed-fence", b"", ephemeral=True, makepath=True)
    assert ledger.claim([Claim(name, EntryState(last_run_at, 1, epoch=0, slot=last_run_at))], fence).error is None
    zk_client.delete(fence)


def test_a_conflict_never_puts_the_leader_to_sleep_for_max_interval(
    make_scheduler, published: Published, zk_client: KazooClient
) -> None:
    """Someone else writes an entry: the leader re-reads and claims again within a second, not after 300 s."""
    scheduler = make_scheduler({"a": every(1), "b": every(1)}, beat_max_loop_interval=300)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 2, timeout=10)
    path = scheduler.ledger.entry_path("a")
    data, _ = zk_client.get(path)
    zk_client.set(path, data)  # a new version, the same content
    returns = run_for(scheduler, 2.5)
    assert max(returns) < 2, returns


def test_entries_deleted_cost_one_re_read_not_one_pass_per_entry(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """<root>/v1/entries deleted under a leader of four entries: one rolled-back batch, then all four publish."""
    names = ["a", "b", "c", "d"]
    scheduler = make_scheduler({n: every(1) for n in names}, beat_max_loop_interval=300)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 4, timeout=10)
    zk_client.delete(f"{zk_root}/v1/entries", recursive=True)
    before = len(published.headers)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        returns = run_for(scheduler, 3)
    assert max(returns) < 2, returns
    assert {h["zkbeat-entry"] for h in published.headers[before:]} == set(names)


def test_an_entry_whose_clock_raises_is_left_out_and_the_rest_runs(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry whose schedule's clock breaks after start-up (with a ledger record) is logged and left out."""
    broken: list[int] = []

    def clock() -> datetime:
        if broken:
            raise ValueError("cannot tell the time (test)")
        return datetime.now(timezone.utc)

    seed(zk_client, zk_root, "broken", datetime.now(timezone.utc) - timedelta(seconds=60))
    entries = {"broken": {"task": "zkbeat.test", "schedule": schedule(timedelta(seconds=1), nowfun=clock)}}
    scheduler = make_scheduler({**entries, "tidy": every(0.5)}, beat_max_loop_interval=1)
    broken.append(1)
    lead(scheduler)
    epoch = scheduler.election.epoch
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        run_for(scheduler, 4)
    assert published.entries().count("tidy") >= 5
    assert "broken" not in published.entries()
    assert scheduler.election.epoch == epoch, "no step-down"
    assert 1 <= len(messages(caplog, "leaving out 'broken'")) <= 2


def test_an_entry_name_the_ledger_cannot_hold_is_left_out(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry named "" is logged once and left out; every other entry runs and nothing stays pending."""
    scheduler = make_scheduler({"": every(1), "tidy": every(0.5)}, beat_max_loop_interval=1)
    lead(scheduler)
    epoch = scheduler.election.epoch
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        run_for(scheduler, 4)
    assert published.entries().count("tidy") >= 5
    assert scheduler.election.epoch == epoch and not scheduler._pending and not scheduler.term.pending
    assert len(messages(caplog, "leaving out ''")) == 1


def test_a_claim_whose_reply_was_lost_is_withdrawn_when_its_replica_stops(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A landed claim still pending when its replica shuts down is written back, so the next leader publishes it."""
    first = make_scheduler({"tidy": every(1)}, beat_max_loop_interval=1)
    lead(first)
    lost: list[datetime] = []

    def claim_and_lose_the_reply(claims, fence):
        real(claims, fence)
        stop_intercepting(first.ledger, monkeypatch)
        lost.append(claims[0].state.slot)
        raise ConnectionLoss("reply lost (test)")

    real = intercept_claims(first.ledger, monkeypatch, claim_and_lose_the_reply)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(lambda: first.tick() is not None and lost, timeout=10)
        assert first._pending
        second = make_scheduler({"tidy": every(1)}, beat_max_loop_interval=1)
        first.close()  # beat's SIGTERM: the first replica never leads again
        lead(second)
        wait_for(lambda: second.tick() is not None and len(published.headers) >= 2, timeout=10)
    slots = [h["zkbeat-slot"] for h in published.headers]
    assert slots.count(lost[0].isoformat()) == 1, slots
    assert len(slots) == len(set(slots))
    assert messages(caplog, "written back")


def test_one_entry_someone_else_made_read_only_leaves_the_others_running(
    make_scheduler, published: Published, zk_server: ZooKeeperServer, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger's ACL on one entry: that entry is logged and left out, the others publish, nobody steps down."""
    mallory = KazooClient(zk_server.hosts, auth_data=[("digest", "mallory:secret")])
    mallory.start(timeout=15)
    try:
        entries = f"{zk_root}/v1/entries"
        mallory.ensure_path(entries)
        acl = [make_digest_acl("mallory", "secret", all=True), ACL(Permissions.READ, Id("world", "anyone"))]
        long_ago = datetime.now(timezone.utc) - timedelta(days=1)
        mallory.create(f"{entries}/locked", encode_state(EntryState(long_ago, 3)), acl=acl)
        scheduler = make_scheduler({"locked": every(1), "tidy": every(1)}, beat_max_loop_interval=1)
        lead(scheduler)
        epoch = scheduler.election.epoch
        with caplog.at_level(logging.INFO, logger="zkbeat"):
            run_for(scheduler, 6)
    finally:
        mallory.stop()
        mallory.close()
    assert published.entries().count("tidy") >= 4
    assert "locked" not in published.entries()
    assert scheduler.election.epoch == epoch, "no step-down for one refused entry"
    refusals = messages(caplog, "refused the claim of entry 'locked'")
    assert 1 <= len(refusals) <= 7, "retried once per max_interval (1 s), not in a loop"
    assert zk_root in refusals[0], "the log says where"


def test_withdrawals_with_zookeeper_silent_do_not_hold_signals(
    make_scheduler, published: Published, zk_server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper and the broker cut together after a batch committed: one withdrawal at most, signals not held."""
    with TcpProxy(zk_server.port) as proxy:
        scheduler = make_scheduler({f"e{i}": every(1) for i in range(6)}, hosts=proxy.hosts, beat_max_loop_interval=1)
        lead(scheduler)
        wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 6, timeout=15)

        def partition(entry, *args, **kwargs):
            proxy.blackhole()
            raise OperationalError("connection refused (test)")

        monkeypatch.setattr(scheduler, "apply_async", partition)
        samples: list[str] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(getattr(signal.getsignal(signal.SIGTERM), "__name__", ""))
                time.sleep(0.2)

        time.sleep(1.05)
        threading.Thread(target=sample, daemon=True).start()
        started = time.monotonic()
        try:
            scheduler.tick()
        except BaseException:  # noqa: BLE001 - only the time matters here
            pass
        took = time.monotonic() - started
        stop.set()
        proxy.heal()
    assert took < 2 * 4 + 2, f"one pass took {took:.1f}s for 6 entries (session 4 s)"
    assert samples.count("record") <= 2, f"SIGTERM was held in {samples.count('record')} of {len(samples)} samples"


@pytest.fixture
def black_holed_broker(redis_server: RedisServer):
    with TcpProxy(redis_server.port) as proxy:
        yield proxy


@pytest.mark.parametrize("path", ["per message", "pipeline"])
def test_a_publish_hung_on_a_silent_broker_lets_sigterm_through(
    make_scheduler,
    published: Published,
    black_holed_broker: TcpProxy,
    zk_client: KazooClient,
    zk_root: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    """A send hung on a silent broker holds SIGTERM only so long; the unsent ticks of its batch are written back.

    On the pipeline path (zkbeat.leading.batch_publish) one message a write, so that
    the second tick is not yet written when the first hangs; on the
    per-message path (RabbitMQ, older kombu) each tick is its own send.
    """
    if path == "pipeline":
        monkeypatch.setattr("zkbeat.leading.batch_publish.CHUNK", 1)
    else:
        monkeypatch.setattr("zkbeat.leading.publisher.can_batch", lambda app, producer: False)
    proxy = black_holed_broker
    scheduler = make_scheduler(
        {"a": every(1), "b": every(1)}, broker_url=f"redis://127.0.0.1:{proxy.port}/0", beat_max_loop_interval=1
    )
    monkeypatch.setattr("zkbeat.leading.term.SIGNAL_HOLD_LIMIT", 2.0)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 2, timeout=15)

    try:
        with sigterm_raises():
            time.sleep(1.05)
            proxy.blackhole()
            timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))  # as `kill` would send it
            timer.start()
            started = time.monotonic()
            with pytest.raises(Terminated):
                while time.monotonic() - started < 30:
                    scheduler.tick()
            took = time.monotonic() - started
    finally:
        proxy.heal()
    assert took < 15, f"SIGTERM waited {took:.1f}s"
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        scheduler.close()  # beat's shutdown: the claims never sent are written back
    cut = messages(caplog, "was cut short")
    assert len(cut) == 1, "the tick whose send hung may have gone out: logged, not written back (at most once)"
    hung = "a" if "send of a " in cut[0] else "b"
    other = "b" if hung == "a" else "a"
    state = Ledger(zk_client, zk_root).load([other])[other].state
    last_sent = [h["zkbeat-slot"] for h in published.headers if h["zkbeat-entry"] == other][-1]
    assert state.slot.isoformat() == last_sent, "the batch's unsent tick was written back: it stays due"


def test_an_idle_leader_is_not_taken_for_a_hung_one(make_scheduler, published: Published) -> None:
    """Nothing due for longer than the stall timeout: the leader waits for run-now requests and keeps leading."""
    scheduler = make_scheduler({"slow": every(60)}, beat_max_loop_interval=8, zkbeat_stall_timeout=6)
    lead(scheduler)
    epoch = scheduler.election.epoch
    scheduler.tick()  # takes over; nothing is due for a minute: it waits 8 s for a trigger
    scheduler.tick()
    assert scheduler.watchdog.stalls == 0
    assert scheduler.election.leadership is not None and scheduler.election.epoch == epoch


def test_a_run_now_request_zookeeper_will_not_consume_holds_back_nothing(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stranger's child under one trigger request: it is left out once, no hot loop, the other request runs."""
    from zkbeat.ledger.controls import request_trigger

    scheduler = make_scheduler({"a": every(3600), "b": every(3600)}, beat_max_loop_interval=2)
    lead(scheduler)
    scheduler.tick()
    bad = request_trigger(zk_client, zk_root, "a", "op", scheduled=True)
    zk_client.create(f"{bad}/stranger", b"")  # the consume's delete fails: NotEmpty
    good = request_trigger(zk_client, zk_root, "b", "op", scheduled=True)
    passes = 0
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            scheduler.tick()
            passes += 1
    assert passes < 20, f"{passes} leader passes in 4 s: a hot loop"
    assert published.entries().count("b") == 1 and zk_client.exists(good) is None
    assert "a" not in published.entries()
    assert len(messages(caplog, f"leaving out the trigger request {bad}")) == 1
