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
from celery.signals import after_task_publish

from tests.support.helpers import Published, connected, early_answers, every, lead
from zkbeat.leading import heap_pass
from zkbeat.leading.term import ON_TIME, Term


@pytest.mark.parametrize("options", [{}, {"zkbeat_catchup": "all"}], ids=["once", "catchup-all"])
def test_an_on_time_interval_is_not_asked_before_its_next_slot(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, options: dict
) -> None:
    """Catch-up 'all' goes on from its slot by a path of its own (the policy's advance), placed the same way."""
    original = Term._recheck_unknown

    def slow(self, dues, requeue):  # the time a burst's scan or a ledger read takes before the term reads its clock
        time.sleep(ON_TIME / 2)  # still on time: longer, the entry goes on from the moment it ran
        return original(self, dues, requeue)

    monkeypatch.setattr(Term, "_recheck_unknown", slow)
    scheduler = make_scheduler({"grid": every(1.0, options=options)})
    lead(scheduler)
    early = early_answers(scheduler, published, monkeypatch, publishes=5)
    assert heap_pass.HEAP_LAG < ON_TIME / 2
    assert early == [], f"taken off the heap before its next slot: {early}"


@pytest.mark.usefixtures("beat_db")
@pytest.mark.beat_scheduler("zkbeat.DatabaseScheduler")
def test_a_database_row_on_time_vouches_for_its_slot(make_scheduler, published: Published) -> None:
    """A django-celery-beat row run on time goes on from its slot, and what the row vouches for (the run its row will
    hold, weighed against the ledger's) is that slot too, not the clock reading its successor was first given."""
    from tests.support.djangosupport import interval_task, pump

    interval_task("grid-row", 1)
    scheduler = make_scheduler()
    sent_at: dict[str, float] = {}

    def note(headers=None, **kwargs) -> None:
        sent_at[headers["zkbeat-slot"]] = time.time()

    def last_on_time() -> bool:  # a loaded machine may publish a tick past ON_TIME: it goes on from then
        rows = published.of("grid-row")
        return len(rows) >= 2 and sent_at[rows[-1][1]] - datetime.fromisoformat(rows[-1][1]).timestamp() < ON_TIME

    lead(scheduler)
    with connected(after_task_publish, note):
        pump(scheduler, last_on_time, timeout=60)
    slots = [datetime.fromisoformat(slot) for _, slot, _ in published.of("grid-row")]
    entry = scheduler.schedule["grid-row"]
    assert entry.last_run_at == slots[-1], (entry.last_run_at, slots)
    assert entry.row_last_run_at == entry.last_run_at, (entry.row_last_run_at, entry.last_run_at)
