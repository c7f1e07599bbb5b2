"""zkbeat.DatabaseScheduler: a row rebuilt from the table keeps the run the leader knows from the ledger.

A leader killed before it wrote its run times back leaves rows that say
nothing of their last run; the next leader knows those runs from the
ledger. A change to the table rebuilds such a row's entry from the row
alone, whose run is then "now": it must come due at the run the leader
knows plus its interval, not a whole interval after the rebuild (a tick
late, and the ticks after it shifted by as much).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from kazoo.client import KazooClient

from tests.support.djangosupport import ON_THE_DATABASE, interval_task
from tests.support.helpers import lead, wait_for
from zkbeat.ledger.store import Claim, EntryState, Ledger

pytestmark = ON_THE_DATABASE


def _heap_time(scheduler, name: str) -> float | None:
    heap = scheduler._heap or []
    times = [event.time for event in heap if event.entry.name == name]
    return times[0] if times else None


def test_a_row_rebuilt_without_a_run_of_its_own_comes_due_at_the_ledgers_run_plus_its_interval(
    make_scheduler, zk_client: KazooClient, zk_root: str
) -> None:
    last = datetime.now(timezone.utc) - timedelta(seconds=50)
    row = interval_task("report", 60)  # no last run of its own: its leader never wrote it back
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    ran = EntryState(last_run_at=last, total_run_count=3, slot=last)
    assert ledger.claim([Claim("report", ran)], None).error is None
    due = (last + timedelta(seconds=60)).timestamp()

    scheduler = make_scheduler()
    scheduler.wait_in_tick = False
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and _heap_time(scheduler, "report") is not None, timeout=20)
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
