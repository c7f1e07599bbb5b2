"""zkbeat.Scheduler in-process against real ZooKeeper and Redis: what the
leader publishes, what it records, and what stops it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from tests.support.helpers import Published, every, fail_next_claim, lead, wait_for
from tests.support.servers import RedisServer, ZooKeeperServer, expire_session_quietly
from tests.test_log_lines import table
from zkbeat import ConfigurationError, Scheduler
from zkbeat.coordination.election import LeaderElection
from zkbeat.ledger.store import Claim, EntryState, Ledger
from zkbeat.scheduler import task_id_for, tick_slot


def seed_ledger(zk_client: KazooClient, root: str, name: str, last_run_at: datetime, count: int = 7) -> None:
    ledger = Ledger(zk_client, root)
    ledger.ensure()
    fence = zk_client.create(f"{root}/seed-fence", b"", ephemeral=True, makepath=True)
    result = ledger.claim([Claim(name, EntryState(last_run_at, count, epoch=0, slot=last_run_at))], fence)
    assert result.error is None
    zk_client.delete(fence)


def test_leader_publishes_with_headers_and_a_deterministic_task_id(make_scheduler, published: Published) -> None:
    """A due entry is published once with zkbeat-entry/slot/epoch headers and a uuid5 task id per slot."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)
    headers = published.headers[0]
    slot = datetime.fromisoformat(headers["zkbeat-slot"])
    assert headers["zkbeat-entry"] == "tidy"
    assert headers["zkbeat-epoch"] == scheduler.election.epoch
    assert headers["id"] == task_id_for(scheduler.zk_settings.root, "tidy", slot)
    record = scheduler.ledger.load(["tidy"])["tidy"]
    assert record.state.slot == slot and record.state.epoch == scheduler.election.epoch


def test_a_follower_neither_publishes_nor_writes_the_ledger(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """While another candidate leads, tick() waits and returns 0, and nothing reaches the broker or ZooKeeper."""
    holder = LeaderElection(zk_client, f"{zk_root}/v1/election")
    holder.start()
    assert holder.wait_for_leadership(timeout=10)
    try:
        scheduler = make_scheduler({"tidy": every(0.1)})
        wait_for(lambda: scheduler.election.candidate is not None)
        for _ in range(4):
            assert scheduler.tick() == 0
        assert published.headers == []
        assert zk_client.exists(f"{zk_root}/v1/entries") is None
    finally:
        holder.close()
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)


def test_new_leader_trusts_the_ledger_over_its_own_memory(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """An entry the previous leader just ran is not run again; one missed for two periods is caught up once."""
    now = datetime.now(timezone.utc)
    seed_ledger(zk_client, zk_root, "fresh", now - timedelta(seconds=1))
    seed_ledger(zk_client, zk_root, "missed", now - timedelta(seconds=25))
    scheduler = make_scheduler({"fresh": every(10), "missed": every(10)})
    lead(scheduler)
    for _ in range(5):
        scheduler.tick()
    assert published.entries() == ["missed"]
    state = scheduler.ledger.load(["missed"])["missed"].state
    assert state.total_run_count == 8
    assert state.slot < now - timedelta(seconds=10), "the caught-up slot is the first one missed"


def test_misfire_grace_time_skips_and_logs(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A tick later than zkbeat_misfire_grace_time is skipped and logged; a per-entry option overrides it."""
    long_ago = datetime.now(timezone.utc) - timedelta(seconds=100)
    seed_ledger(zk_client, zk_root, "stale", long_ago)
    seed_ledger(zk_client, zk_root, "patient", long_ago)
    scheduler = make_scheduler(
        {"stale": every(10), "patient": every(10, options={"zkbeat_misfire_grace_time": 1000})},
        zkbeat_misfire_grace_time=5,
    )
    lead(scheduler)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        for _ in range(5):
            scheduler.tick()
    assert published.entries() == ["patient"]
    assert "zkbeat_misfire_grace_time" not in published.headers[0]
    assert any("skipping stale" in r.getMessage() for r in caplog.records)
    stale = scheduler.ledger.load(["stale"])["stale"].state
    assert stale.total_run_count == 7, "a skipped tick is not counted as a run"
    assert stale.last_run_at > long_ago + timedelta(seconds=90), "the skip is recorded so no leader replays it"


def test_due_entries_are_claimed_in_one_transaction(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """200 entries due at once are recorded by a single ZooKeeper transaction (one zxid), then all published."""
    long_ago = datetime.now(timezone.utc) - timedelta(seconds=60)
    names = [f"job-{i:03d}" for i in range(200)]
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    fence = zk_client.create(f"{zk_root}/seed-fence", b"", ephemeral=True)
    assert ledger.claim([Claim(n, EntryState(long_ago, 0)) for n in names], fence).error is None
    zk_client.delete(fence)
    scheduler = make_scheduler({n: every(30) for n in names})
    lead(scheduler)
    scheduler.tick()
    assert sorted(published.entries()) == names
    zxids = {zk_client.exists(ledger.entry_path(n)).mzxid for n in names}
    assert len(zxids) == 1


def test_zombie_is_stopped_by_the_fence_alone(
    make_scheduler,
    published: Published,
    zk_server: ZooKeeperServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With its listener held back (it still believes it leads), a leader whose session expired publishes nothing."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)
    before = len(published.headers)
    election = scheduler.election
    # Hold the listener back: kazoo never tells the election about the lost
    # session, and its worker re-checks nothing, so the replica goes on
    # believing it leads at the same epoch once kazoo has a new session.
    scheduler.zk_client.remove_listener(election._on_connection_state)
    monkeypatch.setattr(election, "_reconcile", lambda: None)
    old_session = scheduler.zk_client.client_id
    expire_session_quietly(*old_session, zk_server.hosts)
    wait_for(
        lambda: scheduler.zk_client.connected and scheduler.zk_client.client_id[0] != old_session[0],
        timeout=20,
        message="kazoo reconnected with a new session",
    )
    assert election.is_leader, "the test needs a replica that still believes it leads"
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and not election.is_leader, timeout=10)
        for _ in range(3):
            scheduler.tick()
    assert len(published.headers) == before
    fenced = table()["a claim fenced"]  # the line docs/operating.md tells an operator to look for
    assert any(r.levelname == fenced.level and fenced.pattern.fullmatch(r.getMessage()) for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


def test_a_message_the_broker_can_never_take_is_dropped_once(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A tick whose arguments cannot be serialised is logged and counted as run, as celery beat does, not retried."""
    seed_ledger(zk_client, zk_root, "broken", datetime.now(timezone.utc) - timedelta(seconds=60))
    broken = every(30)
    broken["args"] = (object(),)  # cannot be serialised: publish fails after the claim
    scheduler = make_scheduler({"broken": broken, "fine": every(0.2)})
    lead(scheduler)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and published.entries().count("fine") >= 3, timeout=10)
    assert "broken" not in published.entries()
    assert len([r for r in caplog.records if "broken (slot" in r.getMessage() and "dropped" in r.getMessage()]) == 1
    assert scheduler.ledger.load(["broken"])["broken"].state.total_run_count == 8
    assert scheduler.election.is_leader, "a refused message must not cost leadership"


def test_an_unreachable_broker_withdraws_the_claim(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the broker connection fails after the claim committed, the claim is withdrawn and the tick goes out later."""
    from kombu.exceptions import OperationalError

    scheduler = make_scheduler({"tidy": every(0.5)})
    lead(scheduler)
    original = scheduler.apply_async
    refused: list[str] = []

    def refuse_once(entry, *args, **kwargs):
        monkeypatch.setattr(scheduler, "apply_async", original)
        refused.append(entry.options["headers"]["zkbeat-slot"])
        raise OperationalError("connection refused")

    monkeypatch.setattr(scheduler, "apply_async", refuse_once)
    wait_for(lambda: scheduler.tick() is not None and refused, timeout=10)
    assert scheduler.ledger.load(["tidy"])["tidy"].state.total_run_count == 0, "the claim is withdrawn"
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=20)
    assert published.headers[0]["zkbeat-slot"] == refused[0], "the same tick goes out, once"
    assert scheduler.ledger.load(["tidy"])["tidy"].state.total_run_count == 1


def test_close_hands_over_and_is_idempotent(make_scheduler, zk_client: KazooClient) -> None:
    """close() deletes the candidate (the handover) and may be called twice, as celery beat does on SIGTERM."""
    scheduler = make_scheduler({"tidy": every(1)})
    lead(scheduler)
    candidate = scheduler.election.candidate
    scheduler.close()
    scheduler.close()
    assert zk_client.exists(candidate) is None


def test_unreachable_zookeeper_keeps_beat_alive_as_a_follower(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing listening at zkbeat_hosts, beat starts, logs where it connects, waits, and publishes nothing."""
    from tests.support.servers import free_port

    hosts = f"127.0.0.1:{free_port()}"
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        scheduler = make_scheduler({"tidy": every(0.1)}, hosts=hosts)
        assert scheduler.tick() == 0
        assert scheduler.tick() == 0
    assert published.headers == []
    assert any(hosts in r.getMessage() for r in caplog.records)


def test_bad_setting_fails_before_any_io(redis_server: RedisServer) -> None:
    """A bad zkbeat_* value stops beat at construction, naming the setting — even the lazy banner instance."""
    app = Celery("zkbeat-test", set_as_current=False)
    app.conf.update(broker_url=redis_server.url, zkbeat_session_timeout=-1)
    with pytest.raises(ConfigurationError, match="zkbeat_session_timeout"):
        Scheduler(app, lazy=True)


def test_schedule_filename_is_accepted_and_ignored(make_scheduler, tmp_path) -> None:
    """`-s file` is accepted for drop-in compatibility; no shelve file is written."""
    app = Celery("zkbeat-test", set_as_current=False)
    scheduler = Scheduler(app, lazy=True, schedule_filename=str(tmp_path / "celerybeat-schedule"))
    scheduler.close()
    assert list(tmp_path.iterdir()) == []


def test_slot_depends_only_on_the_last_run() -> None:
    """Two replicas holding the same last_run_at name the same slot, whenever they ask."""
    app = Celery("zkbeat-test", set_as_current=False)
    from celery.beat import ScheduleEntry

    last = datetime(2026, 1, 5, 10, 0, 0, 123456, tzinfo=timezone.utc)
    for sched, expected in (
        (schedule(timedelta(seconds=30)), last + timedelta(seconds=30)),
        (crontab(minute="*/15"), datetime(2026, 1, 5, 10, 15, tzinfo=timezone.utc)),
    ):
        entry = ScheduleEntry(name="e", task="t", schedule=sched, last_run_at=last, app=app)
        assert tick_slot(entry) == expected
        assert tick_slot(entry) == tick_slot(entry)


def test_entry_point_alias_resolves() -> None:
    """`celery beat --scheduler zkbeat` finds zkbeat.Scheduler through the celery.beat_schedulers entry point."""
    from celery.utils.imports import load_extension_class_names, symbol_by_name

    aliases = dict(load_extension_class_names("celery.beat_schedulers"))
    assert symbol_by_name("zkbeat", aliases=aliases) is Scheduler


def test_a_commit_whose_reply_was_lost_is_published_once(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that committed while its reply was lost is published on the next leader pass: once, not never."""
    scheduler = make_scheduler({"tidy": every(0.5)})
    lead(scheduler)
    committed = fail_next_claim(scheduler, monkeypatch, ConnectionLoss())
    wait_for(lambda: scheduler.tick() is not None and committed, timeout=10)
    assert published.headers == []
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)
    slots = [datetime.fromisoformat(h["zkbeat-slot"]) for h in published.headers]
    assert slots[0] == committed[0]
    assert len(slots) == len(set(slots))


def test_a_claim_lost_before_commit_is_claimed_again(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim whose request never committed is not published from memory; the tick is claimed afresh instead."""
    scheduler = make_scheduler({"tidy": every(0.5)})
    lead(scheduler)
    tried: list[str] = []
    fail_next_claim(scheduler, monkeypatch, ConnectionLoss(), commit=False, tried=tried)
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)
    assert tried == ["tidy"], "the claim never failed: the test proves nothing"
    slots = [h["zkbeat-slot"] for h in published.headers]
    assert len(slots) == len(set(slots))
    assert scheduler.ledger.load(["tidy"])["tidy"].state.total_run_count == len(slots)


def test_each_entry_of_a_burst_goes_back_on_the_heap_by_when_it_was_due(make_scheduler) -> None:
    """An entry sent early in a long batch is placed its interval after the pass looked, not after the last send."""
    import time

    from celery.signals import after_task_publish

    due = datetime.now(timezone.utc) - timedelta(seconds=61)
    names = [f"burst-{i:03d}" for i in range(300)]
    scheduler = make_scheduler({name: every(60, last_run_at=due) for name in names})
    lead(scheduler)
    sent: dict[str, float] = {}

    def note(headers=None, **kwargs) -> None:
        sent[(headers or {}).get("zkbeat-entry")] = time.time()

    after_task_publish.connect(note, weak=False)
    try:
        wait_for(lambda: scheduler.tick() is not None and len(sent) == len(names), timeout=30)
    finally:
        after_task_publish.disconnect(note)
    placed = {event[2].name: event[0] for event in scheduler._heap}
    # Due again 60 s after it ran; the heap may look earlier (is_due decides), never later.
    late = {name: placed[name] - (sent[name] + 60) for name in names if placed[name] > sent[name] + 60}
    assert not late, f"{len(late)} entries placed after they are due, by up to {max(late.values()):.3f} s"
