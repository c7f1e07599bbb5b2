"""An entry's recent runs as the ledger encodes them (pure logic): bounded, read back equal, and bad data from
ZooKeeper or fields of another release logged and survived with the entry's state kept; and zkbeat_recent_runs
against a real ZooKeeper."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import schedule
from kazoo.client import KazooClient

from tests.support.helpers import every, lead, wait_for
from zkbeat.ledger.history import MAX_RECENT_BYTES, MAX_REPLICA, RECENT_RUNS, Run, add_run, encoded_bytes, kind_of
from zkbeat.ledger.store import EntryState, Ledger, Pause, decode_state, encode_state

SLOT = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
EMPTY = EntryState(last_run_at=SLOT)


def full_state(runs: int, replica: str = "worker-3.example.com:4242") -> EntryState:
    recent: tuple[Run, ...] = ()
    for n in range(runs):
        slot = SLOT + timedelta(seconds=n)
        recent = add_run(recent, Run.of(slot, slot + timedelta(seconds=0.0123), replica, 7 + n // 5, "scheduled"))
    return EntryState(last_run_at=SLOT, total_run_count=runs, epoch=9, updated_at=SLOT, slot=SLOT, recent=recent)


def test_runs_are_bounded_newest_first_and_read_back_equal() -> None:
    """Adding runs keeps the newest RECENT_RUNS, newest first; the ledger's encoding reads back the same state."""
    state = full_state(RECENT_RUNS + 5)
    assert len(state.recent) == RECENT_RUNS
    assert [run.slot for run in state.recent] == sorted((run.slot for run in state.recent), reverse=True)
    assert state.recent[0].slot == (SLOT + timedelta(seconds=RECENT_RUNS + 4)).replace(microsecond=123000)
    # Equal after a round trip: a pending claim is settled by comparing what it wrote with what the ledger holds.
    assert decode_state(encode_state(state)) == state
    assert state.recent[0].late_seconds == 0.012


def test_a_long_identity_is_cut_and_the_size_per_entry_is_bounded() -> None:
    """An identity past MAX_REPLICA characters is cut; K runs of the worst identity stay within MAX_RECENT_BYTES."""
    worst = "\U0001f600" * 300
    state = full_state(RECENT_RUNS, replica=worst)
    assert len(state.recent[0].replica) == MAX_REPLICA and state.recent[0].replica.endswith("…")
    assert decode_state(encode_state(state)) == state
    added = len(encode_state(state)) - len(encode_state(replace(state, recent=())))
    assert added <= MAX_RECENT_BYTES < 8400
    typical = full_state(RECENT_RUNS)
    typical_added = len(encode_state(typical)) - len(encode_state(replace(typical, recent=())))
    assert typical_added < 700, typical_added  # the ~0.7 KB per entry the docs state
    # What packing claims into transactions counts is never less than what is written.
    for sample in (state, typical, full_state(RECENT_RUNS, "é" * 64), full_state(1, "x" * 64)):
        written = len(encode_state(sample)) - len(encode_state(replace(sample, recent=())))
        assert written <= encoded_bytes(sample.recent) <= MAX_RECENT_BYTES, (written, sample.recent[0])


def test_an_unknown_field_of_another_release_is_ignored() -> None:
    """A record with a field this release does not know reads as its known fields, history included."""
    data = json.loads(encode_state(full_state(3)))
    data["shard_owner"] = {"from": "a later release", "n": [1, 2]}
    state = decode_state(json.dumps(data).encode())
    assert state == full_state(3)


@pytest.mark.parametrize(
    "recent",
    [
        "not a list",
        {"slot": "x"},
        [["2026-01-01T12:00:00+00:00", "2026-01-01T12:00:01+00:00", "r"]],
        [["not a time", "2026-01-01T12:00:01+00:00", "r", 1, "scheduled"]],
        [["2026-01-01T12:00:00+00:00", "2026-01-01T12:00:01+00:00", "r", True, "scheduled"]],
        [["2026-01-01T12:00:00+00:00", "2026-01-01T12:00:01+00:00", "r", 1, "sometimes"]],
        [["2026-01-01T12:00:00+00:00", 5, "r", 1, "scheduled"]],
        [None],
    ],
)
def test_a_malformed_history_is_logged_and_read_as_none_the_state_kept(
    recent: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad data in 'recent' (from ZooKeeper, anyone may write it) is logged; the entry's history is empty, the rest
    of its state (last run, count, epoch, pause) is kept."""
    good = EntryState(last_run_at=SLOT, total_run_count=4, epoch=3, updated_at=SLOT, slot=SLOT,
                      paused=Pause(by="ops", at=SLOT, note="n"), manual="request-0000000001")  # fmt: skip
    data = json.loads(encode_state(good))
    data["recent"] = recent
    with caplog.at_level(logging.WARNING, logger="zkbeat.ledger.history"):
        state = decode_state(json.dumps(data).encode())
    assert state == good and state.recent == ()
    assert "'recent' runs record zkbeat cannot read" in caplog.text


def test_a_tick_claimed_after_its_next_slot_is_a_catch_up() -> None:
    """A tick claimed once the entry's next slot had come too is a catch-up; on time or late within it, scheduled."""
    entry = ScheduleEntry(name="e", task="t", schedule=schedule(timedelta(seconds=10)),
                          app=Celery("h", set_as_current=False))  # fmt: skip
    slot = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert kind_of(entry, slot, slot + timedelta(seconds=0.2)) == "scheduled"
    assert kind_of(entry, slot, slot + timedelta(seconds=9)) == "scheduled"
    assert kind_of(entry, slot, slot + timedelta(seconds=10)) == "catch-up"
    with pytest.raises(ValueError, match="run kind"):
        Run.of(slot, slot, "r", 1, "sometimes")


def test_zkbeat_recent_runs_keeps_that_many_and_zero_keeps_none(
    make_scheduler: Callable[..., Any], zk_client: KazooClient, zk_root: str
) -> None:
    """With zkbeat_recent_runs = 2 a leader's claims keep its two last runs; with 0 the next claim drops the list
    and the znode holds no 'recent' at all."""
    two = make_scheduler({"a": every(0.1)}, identity="keeps-two", zkbeat_recent_runs=2)
    lead(two)
    ledger = Ledger(zk_client, zk_root)

    def state() -> EntryState | None:
        record = ledger.load(["a"]).get("a")
        return record.state if record is not None else None

    wait_for(lambda: two.tick() is not None and (state() or EMPTY).total_run_count >= 4, timeout=20)
    kept = state().recent
    assert len(kept) == 2 and kept[0].at > kept[1].at and {run.replica for run in kept} == {"keeps-two"}
    two.close()

    none = make_scheduler({"a": every(0.1)}, identity="keeps-none", zkbeat_recent_runs=0)
    lead(none)
    before = state().total_run_count
    wait_for(lambda: none.tick() is not None and state().total_run_count >= before + 2, timeout=20)
    assert state().recent == ()
    assert "recent" not in json.loads(zk_client.get(ledger.entry_path("a"))[0])


def test_encoded_bytes_is_at_least_what_runs_add_for_an_identity_json_escapes() -> None:
    """Runs by a replica whose identity JSON escapes (a control character is six bytes, \\u0001, as some
    other release may have written it) are counted at no less than what they add: packing claims into
    transactions relies on it."""
    runs = tuple(Run.of(SLOT, SLOT, "\x01" * 64, 7, "scheduled") for _ in range(RECENT_RUNS))
    for replica in ("\x01" * 64, 'quote"back\\slash' * 4, "\x7f" * 64):
        state = full_state(RECENT_RUNS, replica=replica)
        written = len(encode_state(state)) - len(encode_state(replace(state, recent=())))
        assert written <= encoded_bytes(state.recent) <= MAX_RECENT_BYTES, (written, encoded_bytes(state.recent))
    assert encoded_bytes(runs) >= len(b', "recent": ') + len(json.dumps([list(run) for run in runs]).encode())


def test_a_claim_of_many_entries_with_escaped_runs_fits_zookeeper_requests(
    zk_client: KazooClient, zk_root: str
) -> None:
    """400 entries due at once (a takeover's catch-up), each with RECENT_RUNS runs by an identity JSON escapes,
    are packed into transactions each within ZooKeeper's request limit (jute.maxbuffer, 1 MB): all commit."""
    from zkbeat.ledger.store import Claim

    runs = tuple(Run.of(SLOT, SLOT, "\x01" * 64, 7, "scheduled") for _ in range(RECENT_RUNS))
    state = EntryState(last_run_at=SLOT, total_run_count=1, epoch=7, updated_at=SLOT, slot=SLOT, recent=runs)
    ledger = Ledger(zk_client, zk_root, timeout=30)
    ledger.ensure()
    result = ledger.claim([Claim(f"entry-{i:04d}", state) for i in range(400)], fence=None)
    assert result.error is None and len(result.committed) == 400
