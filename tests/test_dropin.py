"""zkbeat.Scheduler behaves as celery beat's own scheduler where callers rely on it.

Found by running Celery's own scheduler tests against zkbeat: beat's app is
not ``current_app`` there (as in any process with two apps), ``setup_schedule``
may be called again, and ``tick()`` is called directly.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from celery import current_app
from celery.schedules import crontab
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, lead, wait_for
from zkbeat.ledger.controls import request_trigger
from zkbeat.ledger.store import Ledger


def test_a_publish_leaves_the_entrys_schedule_on_beats_own_app(make_scheduler, published: Published) -> None:
    """After a publish the live entry's crontab still reads beat's app (its deadline, its zone), not current_app's."""
    scheduler = make_scheduler(
        lambda app: {
            "nightly": {
                "task": "zkbeat.test",
                "schedule": crontab(minute="*", app=app),
                "last_run_at": datetime.now(timezone.utc) - timedelta(minutes=3),
            }
        },
        beat_cron_starting_deadline=1800,
        timezone="Asia/Tokyo",
    )
    app = scheduler.app
    assert app is not current_app._get_current_object()
    assert current_app.conf.beat_cron_starting_deadline is None  # what a schedule on the wrong app reads
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("nightly") >= 1, timeout=15)
    schedule = scheduler.schedule["nightly"].schedule
    assert schedule.app is app
    assert schedule.app.conf.beat_cron_starting_deadline == 1800
    assert str(schedule.tz) == "Asia/Tokyo"


def _overdue_hourly() -> dict:
    """An hourly entry that last ran two hours ago: due at once, then not for an hour."""
    return every(3600, last_run_at=datetime.now(timezone.utc) - timedelta(hours=2))


def _threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.is_alive()}


def test_setup_schedule_twice_keeps_one_client_and_one_candidate(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """A second setup_schedule() opens no second session; the replica leads and publishes; close() leaves nothing."""
    before = _threads()
    scheduler = make_scheduler({"often": every(0.2)})  # beat's scheduler (not lazy) has set its schedule up
    client, election = scheduler.zk_client, scheduler.election
    scheduler.setup_schedule()
    assert scheduler.zk_client is client and scheduler.election is election
    lead(scheduler)
    election_path = f"{zk_root}/v1/election"
    assert len(zk_client.get_children(election_path)) == 1
    wait_for(lambda: scheduler.tick() is not None and published.count("often") >= 1, timeout=15)
    scheduler.close()
    assert zk_client.get_children(election_path) == []
    wait_for(lambda: _threads() <= before, timeout=15, message=lambda: f"left behind: {_threads() - before}")


def test_an_idle_leaders_tick_waits_for_its_next_entry_and_a_run_now_wakes_it(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """An idle leader's tick() waits (beat_max_loop_interval here: an hour) and returns 0; a run-now ends the wait."""
    scheduler = make_scheduler({"hourly": _overdue_hourly()}, beat_max_loop_interval=3600)
    lead(scheduler)
    scheduler.wait_in_tick = False  # the test's own passes: each returns at once
    wait_for(lambda: scheduler.tick() is not None and published.count("hourly") >= 1, timeout=15)
    scheduler.wait_in_tick = True
    returned: list[float] = []
    waiting = threading.Thread(target=lambda: returned.append(scheduler.tick()), daemon=True)
    waiting.start()
    wait_for(lambda: scheduler.term is not None and not scheduler.term.triggers.changed.is_set(), timeout=15)
    assert waiting.is_alive(), "the tick returned before anything was due"
    request_trigger(zk_client, zk_root, "hourly", by="test")
    wait_for(lambda: returned, timeout=60, message="a run-now request did not end the idle wait")
    assert returned == [0]
    scheduler.wait_in_tick = False
    wait_for(lambda: scheduler.tick() is not None and published.count("hourly") >= 2, timeout=15)


def test_with_wait_in_tick_off_tick_returns_the_seconds_to_wait_as_celerys_does(
    make_scheduler, published: Published
) -> None:
    """``wait_in_tick = False``: a leader's tick() returns the time to its next entry; a follower's the max interval."""
    leader = make_scheduler({"hourly": _overdue_hourly()}, beat_max_loop_interval=600, identity="leader")
    leader.wait_in_tick = False
    lead(leader)
    wait_for(lambda: leader.tick() is not None and published.count("hourly") >= 1, timeout=15)
    assert 0 < _tick_in_a_thread(leader) <= 600
    follower = make_scheduler({"hourly": _overdue_hourly()}, beat_max_loop_interval=600, identity="follower")
    follower.wait_in_tick = False
    # Once its client connected: before its connection thread runs, kazoo answers "Connection has been closed".
    wait_for(lambda: follower.zk_client.connected and len(follower.election.candidates()) == 2, timeout=15)
    assert _tick_in_a_thread(follower) == 600


def _tick_in_a_thread(scheduler) -> float:
    """scheduler.tick(), which must return without waiting (well within its 600 s max interval)."""
    returned: list[float] = []
    threading.Thread(target=lambda: returned.append(scheduler.tick()), daemon=True).start()
    wait_for(lambda: returned, timeout=60, message="tick() waited as if wait_in_tick were on")
    return returned[0]


def test_a_run_now_neither_moves_the_schedule_nor_counts_among_the_runs(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """operating.md: "A run-now does not move the schedule, nor count among the entry's runs (total_run_count)".
    An hourly entry that ran: a run-now publishes once (its zkbeat-manual header), and the ledger keeps the last
    scheduled run, its slot and its count, beat's entry its last run; so no scheduled tick follows the run-now."""
    scheduler = make_scheduler({"hourly": _overdue_hourly()})
    lead(scheduler)
    scheduler.wait_in_tick = False
    wait_for(lambda: scheduler.tick() is not None and published.count("hourly") >= 1, timeout=15)
    ledger = Ledger(zk_client, zk_root)
    before = ledger.load()["hourly"].state
    ran_before = scheduler.schedule["hourly"].last_run_at
    request_trigger(zk_client, zk_root, "hourly", by="test")
    wait_for(lambda: scheduler.tick() is not None and published.count("hourly") >= 2, timeout=30)
    for _ in range(3):
        scheduler.tick()
    assert published.count("hourly") == 2, "the run-now was followed by a scheduled tick"
    assert [h.get("zkbeat-manual") is not None for h in published.headers if h.get("zkbeat-entry") == "hourly"] == [
        False,
        True,
    ]
    after = ledger.load()["hourly"].state
    assert (after.last_run_at, after.slot, after.total_run_count) == (
        before.last_run_at,
        before.slot,
        before.total_run_count,
    )
    assert scheduler.schedule["hourly"].last_run_at == ran_before, "the run-now moved the entry's schedule"
