"""The rule zkbeat.ledger.clock's table states, row by row, on ledger states alone: which
ledger times a leader trusts, which slots count as published early, and which
due ticks are skipped for them (on an interval's slots and on a crontab's grid).
The same rule with real processes and skewed clocks: tests/test_skew.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab

from zkbeat.ledger.clock import LEDGER_TOLERANCE, MAX_EARLY_SPANS, ahead_of_write, as_trusted, early_slots, near_early
from zkbeat.ledger.store import EntryState, decode_state, encode_state

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def spans(*pairs: tuple[float, float]) -> tuple:
    return tuple((at(first), at(last)) for first, last in pairs)


def state(last_run: float, slot: float | None = None, *early: tuple[float, float]) -> EntryState:
    return EntryState(last_run_at=at(last_run), slot=None if slot is None else at(slot), early=spans(*early))


def interval(seconds: float) -> ScheduleEntry:
    app = Celery("clock", set_as_current=False)
    return ScheduleEntry(name="i", task="t", schedule=timedelta(seconds=seconds), last_run_at=T0, app=app)


def test_a_last_run_within_the_tolerance_of_its_write_is_trusted() -> None:
    """A last run no later than ZooKeeper's time of its write plus the tolerance is the entry's last run."""
    written = at(10)
    trusted = as_trusted(state(10 + LEDGER_TOLERANCE, 9), written)
    assert not ahead_of_write(state(10 + LEDGER_TOLERANCE), written)
    assert trusted.last_run_at == at(10 + LEDGER_TOLERANCE) and trusted.early == ()


def test_a_last_run_ahead_of_its_write_is_not_trusted() -> None:
    """A last run an hour after ZooKeeper's time of its write: the entry goes on from the write (plus the tolerance)."""
    written = at(10)
    assert ahead_of_write(state(3610), written)
    assert as_trusted(state(3610, 3609), written).last_run_at == at(10 + LEDGER_TOLERANCE)
    assert as_trusted(state(3610), None).last_run_at == at(3610), "no write time: nothing to judge by"


def test_a_leader_ahead_trusts_what_its_own_clock_wrote() -> None:
    """A reader an hour ahead trusts a last run an hour after its write, and caps one written further ahead."""
    written, hour = at(10), 3600.0
    assert as_trusted(state(3610), written, offset=hour).last_run_at == at(3610)
    assert as_trusted(state(7210), written, offset=hour).last_run_at == at(10 + hour + LEDGER_TOLERANCE)
    assert as_trusted(state(3610), written, offset=-hour).last_run_at == at(10 + LEDGER_TOLERANCE), "behind: as 0"


@pytest.mark.parametrize(
    ("before", "written", "carried"),
    [
        (state(3610, 3609), 10, [(3609, 3609)]),  # the first slot claimed ahead
        (state(3610, 3609, (3600, 3608)), 10, [(3600, 3609)]),  # the next one, a period on: the span goes on
        (state(3610, 3609, (3580, 3590)), 10, [(3580, 3590), (3609, 3609)]),  # after a gap: a span of its own
        (state(3610, 3609, (3600, 3620)), 10, [(3600, 3620)]),  # within a span already
        (state(5, 4), None, []),  # no write time to judge the slot by: nothing new
        (state(5, 3700, (3600, 3608)), None, [(3600, 3608)]),  # ... and what is known is kept
        (state(5, 4), 10, []),  # on time, and no early span: nothing to carry
        (state(3605, 3604, (3600, 3608)), 3700, [(3600, 3608)]),  # on time within the span: kept
        (state(20, 19, (3600, 3608)), 20, [(3600, 3608)]),  # on time before the span: kept
        (state(20, 20.5), 20, []),  # early by less than the tolerance: on time
        (state(3610, 3609, (30, 40), (3600, 3608)), 3700, []),  # on time past every span: dropped
        (state(100, 99, (30, 40), (3600, 3608)), 100, [(3600, 3608)]),  # ... past one of them
    ],
)
def test_the_early_spans_a_claim_carries(before: EntryState, written: float | None, carried) -> None:
    """Early slots join the span they follow or start one; a slot on time drops the spans it is past."""
    after = early_slots(before, None if written is None else at(written), interval(10))
    assert after == spans(*carried)


def test_at_most_so_many_spans_are_kept_the_nearest_joined() -> None:
    """One span too many: the two nearest become one (their slots in between are skipped too, not repeated)."""
    many = [(1000.0 * n, 1000.0 * n + 5) for n in range(MAX_EARLY_SPANS)]
    many[3] = (3000.0, 3900.0)  # 100 s from the next one: the nearest
    after = early_slots(state(99999, 99990, *many), at(0), interval(10))
    assert len(after) == MAX_EARLY_SPANS and (at(3000), at(4005)) in after and after[-1] == (at(99990), at(99990))


def test_ticks_near_the_early_slots_are_skipped_on_an_interval_and_only_the_early_ones_on_a_grid() -> None:
    """An interval's tick within a period of the early span is skipped; a crontab's grid skips exactly its slots."""
    every, early = interval(10), spans((100.5, 130.5), (500, 510))
    assert near_early(every, at(90.0), early) is None  # its next slot, 100.0, comes before the span
    assert near_early(every, at(95.0), early) == early[0]  # its next slot, 105.0, would fall within it
    assert near_early(every, at(120.0), early) == early[0]
    assert near_early(every, at(135.0), early) == early[0]  # before 140.5, the slot after the span's last
    assert near_early(every, at(140.5), early) is None
    assert near_early(every, at(505), early) == early[1]
    assert near_early(every, at(95.0), ()) is None

    app = Celery("clock", set_as_current=False)
    minutely = ScheduleEntry(name="c", task="t", schedule=crontab(minute="*", app=app), last_run_at=T0, app=app)
    grid = spans((300, 420))  # 12:05 to 12:07
    assert [near_early(minutely, at(60 * m), grid) is not None for m in range(3, 10)] == [
        False, False, True, True, True, False, False
    ]  # fmt: skip


def test_the_early_span_is_kept_in_the_ledger_and_an_unreadable_one_is_left_out(caplog) -> None:
    """The span survives encoding; one zkbeat cannot read is logged and ignored, the entry's state still read."""
    kept = state(5, 4, (3600, 3609), (7200, 7300))
    assert decode_state(encode_state(kept)) == kept
    raw = encode_state(state(5, 4)).replace(b'"epoch"', b'"early": [["soon", 3]], "epoch"')
    assert decode_state(raw) == state(5, 4)
    assert "'early' record zkbeat cannot read" in caplog.text
