"""An on-time interval's successor goes back on beat's heap at its next slot, not before it.

The term reads its clock after the pass's scan and any ledger read; its
wait to the next slot, counted from the pass's earlier reading, placed the
successor that much early whenever the gap exceeded HEAP_LAG (a burst's
scan, a ledger read for a new entry, a GC pause): asked is_due in vain once
a period, in a pass just before the real one.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tests.support.helpers import Published, every, lead, wait_for
from zkbeat.leading import heap_pass
from zkbeat.leading.term import Term


def test_an_on_time_interval_is_not_asked_before_its_next_slot(
    make_scheduler, published: Published, monkeypatch
) -> None:
    original = Term._recheck_unknown

    def slow(self, dues, requeue):  # the time a burst's scan or a ledger read takes before the term reads its clock
        time.sleep(0.1)
        return original(self, dues, requeue)

    monkeypatch.setattr(Term, "_recheck_unknown", slow)
    scheduler = make_scheduler({"grid": every(1.0)})
    vain: list[str] = []
    scanning = [False]
    ask = scheduler.ask

    def asked(entry):
        answer = ask(entry)
        if scanning[0] and published.count("grid") and not answer.is_due:
            vain.append(f"{entry.name} last run {entry.last_run_at}: not due, {answer.next_time:.4f}s left")
        return answer

    scan = scheduler._scan

    def scanned(heap):
        scanning[0] = True
        try:
            return scan(heap)
        finally:
            scanning[0] = False

    scheduler.ask = asked
    scheduler._scan = scanned
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("grid") >= 5, timeout=30)
    assert heap_pass.HEAP_LAG < 0.1
    assert not vain, vain


@pytest.mark.usefixtures("beat_db")
@pytest.mark.beat_scheduler("zkbeat.DatabaseScheduler")
def test_a_database_row_on_time_vouches_for_its_slot(make_scheduler, published: Published) -> None:
    """A django-celery-beat row run on time goes on from its slot, and what the row vouches for (the run its row will
    hold, weighed against the ledger's) is that slot too, not the clock reading its successor was first given."""
    from tests.support.djangosupport import interval_task, pump

    interval_task("grid-row", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("grid-row") >= 3)
    slots = [datetime.fromisoformat(slot) for _, slot, _ in published.of("grid-row")]
    entry = scheduler.schedule["grid-row"]
    assert entry.last_run_at == slots[-1], (entry.last_run_at, slots)
    assert entry.row_last_run_at == entry.last_run_at, (entry.row_last_run_at, entry.last_run_at)
