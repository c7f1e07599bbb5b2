"""An interval entry published on time keeps its grid: its next slot is one interval after this one.

Counted from the moment the pass read the clock (which is after the slot:
the heap holds an entry until just past its due moment, and the pass takes
time), each slot came a little later than the one before, and every gap
between two publishes was the interval plus that lateness.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone, tzinfo
from types import SimpleNamespace

import pytest
from celery.schedules import schedule
from celery.signals import after_task_publish

from tests.support.helpers import Published, connected, every, lead, wait_for
from zkbeat.leading.term import ON_TIME, Term, _aware, _on_time
from zkbeat.ticking.jitter import offset


def test_an_interval_published_on_time_goes_on_from_its_slot(make_scheduler, published: Published) -> None:
    interval = 1.0
    jitters = {"grid": 0.0, "jittered": 0.3}
    scheduler = make_scheduler({name: every(interval, options={"zkbeat_jitter": j}) for name, j in jitters.items()})
    root = scheduler.zk_settings.root
    sent_at: dict[tuple[str, str], float] = {}

    def note(headers=None, **kwargs) -> None:
        sent_at[(headers["zkbeat-entry"], headers["zkbeat-slot"])] = time.time()

    def pairs(name: str, jitter: float) -> list[tuple[datetime, datetime, float]]:
        """(slot, next slot, how late the slot went out, from its jittered moment: a jitter is not a misfire)."""
        slots = [datetime.fromisoformat(slot) for _, slot, _ in published.of(name)]
        moments = [slot.timestamp() + offset(root, name, slot, jitter) for slot in slots]
        sent = [sent_at[(name, slot.isoformat())] for slot in slots]
        return [(slots[i], slots[i + 1], sent[i] - moments[i]) for i in range(len(slots) - 1)]

    def on_time(late: float) -> bool:
        # Sent within ON_TIME: planned within it too (the claim and the send come after). Later (a loaded machine),
        # the tick goes on from the moment it ran, as Celery's does, and is not checked here.
        return late <= min(ON_TIME, interval / 2)

    lead(scheduler)
    with connected(after_task_publish, note):
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and all(sum(on_time(late) for _, _, late in pairs(name, j)) >= 2 for name, j in jitters.items())
            ),
            timeout=60,
        )
    for name, jitter in jitters.items():
        for before, after, late in pairs(name, jitter):
            assert late >= 0, f"{name}: published before its (jittered) moment {before}"
            if on_time(late):
                assert after - before == timedelta(seconds=interval), f"{name}: {before} then {after}, {late:.4f}s late"


class OwnInterval(schedule):
    """An interval class of the user's own: it counts as Celery's does, from the moment the entry ran."""


@pytest.mark.parametrize("kind", ["late", "own-class"])
def test_an_interval_late_or_of_a_class_of_its_own_goes_on_from_the_moment_it_ran(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Late past ON_TIME (the term held up twice that before it plans: a burst, a ledger read), or of a schedule
    class of the user's own: the next slot counts from the moment the pass that ran it read the clock, as celery
    beat counts from its run, so each slot is more than an interval after the one before."""
    interval = 1.0
    held = 0.0
    if kind == "late":
        held = 2 * ON_TIME
        original = Term._recheck_unknown

        def slow(self, dues, requeue):
            time.sleep(held)
            return original(self, dues, requeue)

        monkeypatch.setattr(Term, "_recheck_unknown", slow)
        entry = every(interval)
    else:
        entry = every(interval, schedule=OwnInterval(timedelta(seconds=interval)))
    scheduler = make_scheduler({"drift": entry})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("drift") >= 4, timeout=30)
    slots = [datetime.fromisoformat(slot) for _, slot, _ in published.of("drift")]
    for before, after in zip(slots, slots[1:]):
        assert after - before > timedelta(seconds=interval), f"{before} then {after}"


def test_only_celerys_own_absolute_interval_keeps_its_grid() -> None:
    """A relative interval rounds to its own grid; a class of the user's own may count its own way; an interval of
    0 never moves on from its slot: none of them goes on from its slot."""
    slot = datetime.now(timezone.utc)
    kinds = {
        "plain": schedule(timedelta(seconds=10)),
        "relative": schedule(timedelta(seconds=10), relative=True),
        "own class": OwnInterval(timedelta(seconds=10)),
        "zero": schedule(timedelta(0)),
    }
    on_time = {name: _on_time(SimpleNamespace(schedule=s), slot, slot) for name, s in kinds.items()}
    assert on_time == {"plain": 10.0, "relative": None, "own class": None, "zero": None}


class NoOffset(tzinfo):
    """A zone that gives no offset: a datetime in it is naive, as Python defines it."""

    def utcoffset(self, dt: datetime | None) -> None:
        return None


def test_only_a_run_with_an_offset_is_taken_for_aware() -> None:
    """The slot is expressed in the zone of the run reserve() gave; a zone without an offset raised there (the entry
    left out every max_interval), a naive run is of a frame of its own: both keep the old path."""
    moment = datetime(2026, 12, 4, 12, 0, 0)
    assert _aware(moment.replace(tzinfo=timezone.utc))
    assert not _aware(moment)
    assert not _aware(moment.replace(tzinfo=NoOffset()))
    assert not _aware(None)
