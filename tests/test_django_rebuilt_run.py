"""zkbeat.DatabaseScheduler: a row rebuilt from the table keeps the run the leader knows from the ledger.

A leader killed before it wrote its run times back leaves rows that say
nothing of their last run; the next leader knows those runs from the
ledger. A change to the table rebuilds such a row's entry from the row
alone, whose run is then "now": it must come due at the run the leader
knows plus its interval, not a whole interval after the rebuild (a tick
late, and the ticks after it shifted by as much).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.client import KazooClient

from tests.support.djangosupport import ON_THE_DATABASE, database_unreachable, interval_task
from tests.support.helpers import lead, wait_for
from zkbeat.leading.heap_pass import HEAP_LAG
from zkbeat.ledger.store import Claim, EntryState, Ledger

pytestmark = ON_THE_DATABASE


def _heap_time(scheduler, name: str) -> float | None:
    heaps = [shard._heap for shard in scheduler._shards] if scheduler.sharded else [scheduler._heap]
    times = [event.time for heap in heaps for event in heap or [] if event.entry.name == name]
    return times[0] if times else None


def _leads(scheduler) -> bool:
    shards = scheduler._shards if scheduler.sharded else [scheduler]
    return all(shard.term is not None for shard in shards)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_row_rebuilt_without_a_run_of_its_own_comes_due_at_the_ledgers_run_plus_its_interval(
    make_scheduler, zk_client: KazooClient, zk_root: str, shards: int
) -> None:
    last = datetime.now(timezone.utc) - timedelta(seconds=50)
    row = interval_task("report", 60)  # no last run of its own: its leader never wrote it back
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    ran = EntryState(last_run_at=last, total_run_count=3, slot=last)
    assert ledger.claim([Claim("report", ran)], None).error is None
    due = (last + timedelta(seconds=60)).timestamp()

    scheduler = make_scheduler(zkbeat_shards=shards)
    scheduler.wait_in_tick = False
    wait_for(
        lambda: scheduler.tick() is not None and _leads(scheduler) and _heap_time(scheduler, "report") is not None,
        timeout=30,
    )
    assert abs(_heap_time(scheduler, "report") - due) < 5, "the ledger's run places the entry as the term begins"

    held = scheduler.schedule["report"]
    row.description = "edited in the admin"
    row.save()  # the table changed: the row is read again and its entry rebuilt from it
    wait_for(
        lambda: (
            scheduler.tick() is not None
            and scheduler.schedule["report"] is not held
            and _heap_time(scheduler, "report") is not None
        ),
        timeout=20,
    )
    placed = _heap_time(scheduler, "report")
    assert placed is not None and placed - due < 5, (
        f"the rebuilt entry comes due {placed - due:.1f}s after the ledger's run plus its interval"
    )


def test_a_crontab_row_new_to_the_term_goes_back_on_the_heap_at_its_next_slot_not_before(
    make_scheduler, published, monkeypatch, zk_client: KazooClient, zk_root: str
) -> None:
    """A row the term does not know yet (created, re-created, renamed or rebuilt while leading) is read from the
    ledger when it comes due and asked again; a crontab row's answer is its own clock's, read after that read.

    Its next wait counts from that answer. Counted from the pass's reading, taken before the ledger read, its
    successor went back on the heap early by the time the read took, was taken off it that early and asked again
    in vain (every rebuilt crontab row, at its next tick).
    """
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    scheduler = make_scheduler(beat_max_loop_interval=5)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    long_ago = datetime.now(timezone.utc) - timedelta(minutes=10)
    ran = EntryState(last_run_at=long_ago, total_run_count=1, slot=long_ago)  # a namesake's run, older than the row's
    assert ledger.claim([Claim("cron", ran)], None).error is None
    scheduler.wait_in_tick = False
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and scheduler.term is not None, timeout=20)
    # Far enough from the next minute that the tick below and its successor's placement fall within this minute.
    wait_for(lambda: 5 < datetime.now(timezone.utc).second < 45, timeout=70)
    term_ledger = scheduler.term.ledger
    load = term_ledger.load

    def slow_load(*args, **kwargs):
        time.sleep(0.2)  # a ZooKeeper round trip that takes a while (a busy ensemble, a burst of such rows)
        return load(*args, **kwargs)

    monkeypatch.setattr(term_ledger, "load", slow_load)
    every_minute = CrontabSchedule.objects.create(minute="*", hour="*", timezone="UTC")
    PeriodicTask.objects.create(
        name="cron",
        task="jobs.cleanup_messages",
        crontab=every_minute,
        last_run_at=datetime.now(timezone.utc) - timedelta(minutes=5),
    )
    wait_for(lambda: scheduler.tick() is not None and published.count("cron") >= 1, timeout=30)
    placed = _heap_time(scheduler, "cron")
    assert placed is not None
    slot = round(placed / 60) * 60  # its next slot: the minute it was placed at (or just before)
    early = slot + HEAP_LAG - placed
    assert early < HEAP_LAG / 2, f"placed {early:.3f}s before its next slot"


@pytest.mark.parametrize("shards", [1, 2])
def test_a_row_enabled_while_leading_counts_from_its_own_run_not_the_ledgers_older_one(
    make_scheduler, published, zk_client: KazooClient, zk_root: str, shards: int
) -> None:
    """A row enabled again (django-celery-beat's save() of a disabled row empties its last run), or created again
    under the name of one deleted, while a leader leads: as django-celery-beat counts it, from now.

    The ledger still holds the run of its namesake from before the term began (known to the term as it began, the
    row not in its schedule). Taken as the rebuilt row's run, the row came due at once and was published as it was
    enabled, a tick neither django-celery-beat nor the leader before it would publish (with catch-up 'all', every
    slot since that old run); at its next claim the ledger is read as for any row new to the term.
    """
    from django_celery_beat.models import PeriodicTask

    old = datetime.now(timezone.utc) - timedelta(hours=2)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    assert ledger.claim([Claim("report", EntryState(last_run_at=old, total_run_count=7, slot=old))], None).error is None
    row = interval_task("report", 3600, enabled=False)  # disabled when the term begins
    interval_task("canary", 3600)

    scheduler = make_scheduler(zkbeat_shards=shards)
    scheduler.wait_in_tick = False
    wait_for(
        lambda: scheduler.tick() is not None and _leads(scheduler) and _heap_time(scheduler, "canary") is not None,
        timeout=30,
    )
    row = PeriodicTask.objects.get(pk=row.pk)
    row.enabled = True
    row.save()  # the admin's edit: its last run stays empty (emptied when it was disabled)
    enabled_at = time.time()
    wait_for(lambda: scheduler.tick() is not None and _heap_time(scheduler, "report") is not None, timeout=20)
    for _ in range(5):
        scheduler.tick()
    assert published.count("report") == 0, "published as it was enabled"
    placed = _heap_time(scheduler, "report")
    assert placed is not None and placed > enabled_at + 3000, f"due {placed - enabled_at:.0f}s after it was enabled"


@pytest.mark.parametrize("shards", [1, 2])
def test_rows_first_read_after_the_term_began_come_due_at_the_ledgers_run_plus_their_interval(
    make_scheduler, zk_client: KazooClient, zk_root: str, shards: int
) -> None:
    """The read of the tables at the takeover failed: the term began on no schedule, and the rows come with the
    first read that succeeds. They are new to the schedule, but not enabled anew: each takes the ledger's run, as
    the term's merge gives it to the rows of a read before it (not its own empty one: from that read)."""
    last = datetime.now(timezone.utc) - timedelta(seconds=50)
    interval_task("report", 60)  # no last run of its own: its leader never wrote it back
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    assert (
        ledger.claim([Claim("report", EntryState(last_run_at=last, total_run_count=3, slot=last))], None).error is None
    )
    due = (last + timedelta(seconds=60)).timestamp()

    scheduler = make_scheduler(zkbeat_shards=shards)
    scheduler.wait_in_tick = False
    with database_unreachable():
        wait_for(lambda: scheduler.tick() is not None and _leads(scheduler), timeout=20)
        assert _heap_time(scheduler, "report") is None
    wait_for(lambda: scheduler.tick() is not None and _heap_time(scheduler, "report") is not None, timeout=20)
    placed = _heap_time(scheduler, "report")
    assert placed is not None and placed - due < 5, f"comes due {placed - due:.1f}s after the ledger's run plus 60s"
