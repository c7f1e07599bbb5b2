"""Ledger.load holds Python's cyclic garbage collector off while it builds its records, and leaves it as it was.

A takeover's load builds some fifteen container objects per entry; with the
collector on, every 700 of them start a collection and now and then a
full one walks the whole heap: about a third of the load's CPU at 100,000 entries.
"""

from __future__ import annotations

import gc
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.exceptions import ConnectionLoss

from zkbeat.ledger import store
from zkbeat.ledger.history import Run, add_run
from zkbeat.ledger.store import ABSENT, Claim, EntryState, Ledger, decode_answer

ENTRIES = 2000


def _ledger(zk_client, zk_root) -> tuple[Ledger, EntryState]:
    ledger = Ledger(zk_client, zk_root, timeout=60)
    ledger.ensure()
    fence = zk_client.create(f"{zk_root}/fence", ephemeral=True)
    now = datetime.now(timezone.utc)
    runs: tuple[Run, ...] = ()
    for i in range(10):
        runs = add_run(
            runs, Run.of(now + timedelta(seconds=i), now + timedelta(seconds=i, milliseconds=3), "w", 3, "manual")
        )
    state = EntryState(last_run_at=now, total_run_count=5, epoch=3, updated_at=now, slot=now, recent=runs)
    result = ledger.claim([Claim(f"e{i}", state, ABSENT) for i in range(ENTRIES)], fence)
    assert result.error is None
    return ledger, state


@pytest.fixture
def collections():
    """The collections that start while the test runs (gc.callbacks)."""
    started: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(seen)
    yield started
    gc.callbacks.remove(seen)


def test_a_load_runs_no_collection_and_turns_the_collector_back_on(
    zk_client, zk_root, collections, monkeypatch
) -> None:
    """No collection starts while a load decodes thousands of entries; afterwards the collector is on again."""
    ledger, state = _ledger(zk_client, zk_root)
    seen_at_each_decode = []

    def decode(answer):
        seen_at_each_decode.append(len(collections))
        return decode_answer(answer)

    monkeypatch.setattr(store, "decode_answer", decode)
    assert gc.isenabled()
    records = ledger.load()
    assert gc.isenabled()
    assert len(records) == ENTRIES and all(record.state == state for record in records.values())
    assert len(seen_at_each_decode) == ENTRIES
    assert seen_at_each_decode[0] == seen_at_each_decode[-1], "collections started while the load decoded"


def test_a_collector_the_application_turned_off_stays_off(zk_client, zk_root) -> None:
    """An application that disabled the collector finds it disabled after a load."""
    ledger, state = _ledger(zk_client, zk_root)
    gc.disable()
    try:
        records = ledger.load()
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert len(records) == ENTRIES


def test_a_failed_load_turns_the_collector_back_on(zk_client, zk_root, monkeypatch) -> None:
    """A load whose reads fail (the connection lost) raises as before, with the collector on again."""
    ledger, _ = _ledger(zk_client, zk_root)

    def lost(paths):
        raise ConnectionLoss()

    monkeypatch.setattr(ledger, "_read", lost)
    with pytest.raises(ConnectionLoss):
        ledger.load()
    assert gc.isenabled()
