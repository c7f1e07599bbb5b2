"""zkbeat.DatabaseScheduler after a leader whose clock was far ahead: neither the
ledger's future last run nor the row's (which that leader's sync wrote) holds
the entry back (zkbeat.ledger.clock's table; the same with processes: tests/test_skew.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from kazoo.client import KazooClient

from tests.support.djangosupport import ON_THE_DATABASE, interval_task
from tests.support.helpers import Published, lead, wait_for
from zkbeat.ledger.store import Claim, EntryState, Ledger

pytestmark = ON_THE_DATABASE


def test_a_row_and_a_ledger_a_day_ahead_do_not_hold_an_entry_back(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """A row and a ledger entry whose last run is a day ahead (a fast leader's): the entry runs on at once."""
    tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
    interval_task("report", 1, last_run_at=tomorrow)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    state = EntryState(last_run_at=tomorrow, total_run_count=5, slot=tomorrow - timedelta(seconds=1))
    assert ledger.claim([Claim("report", state)], None).error is None

    scheduler = make_scheduler()
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("report") >= 3, timeout=20)
    slots = [slot for _, slot, _ in published.of("report")]
    assert len(slots) == len(set(slots)) and all(datetime.fromisoformat(s) < tomorrow for s in slots)
