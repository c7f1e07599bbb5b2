"""Ledger.load holds Python's cyclic garbage collector off while it builds its records, and leaves it as it was.

A takeover's load builds some fifteen container objects per entry; with the
collector on, every 700 of them start a collection and now and then a
full one walks the whole heap: about a third of the load's CPU at 100,000 entries.
"""

from __future__ import annotations

import gc
import threading
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.exceptions import ConnectionLoss

from zkbeat.ledger import store
from zkbeat.ledger.history import Run, add_run
from zkbeat.ledger.store import ABSENT, Claim, EntryState, Ledger, decode_answer

ENTRIES = 2000


def collecting() -> bool:
    """Whether automatic collections run: the application's switch on, and no load holding them off (threshold 0)."""
    return gc.isenabled() and gc.get_threshold()[0] != 0


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
    assert collecting()
    records = ledger.load()
    assert collecting()
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
    assert collecting()


def test_a_collector_the_application_turns_off_during_a_load_in_another_thread_stays_off(zk_client, zk_root) -> None:
    """The dashboard's or a shard's load in its own thread: the application's gc.disable() meanwhile is kept."""
    ledger, _ = _ledger(zk_client, zk_root)
    inside, go = threading.Event(), threading.Event()

    def keep(name: str) -> bool:
        inside.set()
        assert go.wait(60)
        return True

    loaded: list[dict] = []
    loader = threading.Thread(target=lambda: loaded.append(ledger.load(keep=keep)))
    loader.start()
    try:
        assert inside.wait(60)
        gc.disable()  # the application, in its own thread, while the load holds collections off
    finally:
        go.set()
        loader.join(60)
    try:
        assert not gc.isenabled(), "the load's end turned on the collector the application had turned off"
    finally:
        gc.enable()
    assert len(loaded[0]) == ENTRIES


def test_two_loads_in_two_threads_hold_collections_off_until_the_last_ends(zk_client, zk_root, collections) -> None:
    """Loads overlapping in two threads: the first to end leaves collections off while the other still loads."""
    ledger, _ = _ledger(zk_client, zk_root)
    in_first, in_second, first_go, second_go = (threading.Event() for _ in range(4))

    def holding(inside: threading.Event, go: threading.Event):
        def keep(name: str) -> bool:
            inside.set()
            assert go.wait(60)
            return True

        return keep

    first = threading.Thread(target=lambda: ledger.load(keep=holding(in_first, first_go)))
    second = threading.Thread(target=lambda: ledger.load(keep=holding(in_second, second_go)))
    first.start()
    try:
        assert in_first.wait(60)
        second.start()
        assert in_second.wait(60)
        first_go.set()
        first.join(60)
        assert not first.is_alive()
        started = len(collections)
        garbage = [[i] for i in range(100_000)]  # enough allocations for a hundred collections, were they on
        assert len(collections) == started, "a collection started while the second load still held them off"
        del garbage
    finally:
        first_go.set()
        second_go.set()
        first.join(60)
        second.join(60)
    assert collecting()
    garbage = [[i] for i in range(100_000)]
    assert len(collections) > started, "collections stayed off after both loads"
    del garbage
