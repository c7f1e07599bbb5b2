"""A scheduler subclass with its own ``_when`` (beat's heap time) is asked for every placement on beat's heap.

Celery places an entry on its heap by ``self._when(entry, delay)`` alone, so
a host may keep its heap on a time base of its own. A leader's pass placed
the entries it put back from its own clock reading (epoch seconds) instead:
on such a heap they were never popped again, and each entry ran once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from celery import schedules

from tests.support.helpers import Published, every, lead, lead_until_published, wait_for
from zkbeat import Scheduler

#: is_due() calls of :class:`EveryOtherAsk` (beat may copy the schedule: the count is kept here).
ASKED: Counter = Counter()


class MonotonicHeap(Scheduler):
    """A host whose heap counts on time.monotonic(): a step of the wall clock moves nothing on it."""

    def _when(self, entry, next_time_to_run, mktime=None):
        return time.monotonic() + (self.adjust(next_time_to_run) or 0)


class DecimalHeap(Scheduler):
    """A host whose heap times are Decimals (Celery's own, exactly)."""

    def _when(self, entry, next_time_to_run, mktime=None):
        return Decimal(str(super()._when(entry, next_time_to_run)))


class NaNHeap(Scheduler):
    """A host whose ``_when`` answers NaN (a heap time no time is past)."""

    def _when(self, entry, next_time_to_run, mktime=None):
        return float("nan")


class RaisingWhen(Scheduler):
    """A host whose ``_when`` has a bug."""

    def _when(self, entry, next_time_to_run, mktime=None):
        raise RuntimeError("this host cannot place an entry (test)")


class EveryOtherAsk(schedules.schedule):
    """An interval of 0.2 s that answers "not yet, 0.05 s" at every other ask: a wait counted on its own clock."""

    def __init__(self) -> None:
        super().__init__(timedelta(seconds=0.2))

    def is_due(self, last_run_at):
        ASKED["own"] += 1
        if ASKED["own"] % 2:
            return schedules.schedstate(False, 0.05)
        return super().is_due(last_run_at)

    def __reduce__(self):
        return (self.__class__, ())


def entries() -> dict:
    """An interval the pass's clock answers, and one whose own clock answers (put back from that answer)."""
    return {"plain": every(0.2), "own": {"task": "zkbeat.test", "schedule": EveryOtherAsk()}}


@pytest.mark.beat_scheduler("tests.test_host_when:MonotonicHeap")
def test_entries_put_back_on_a_heap_of_the_host_s_own_time_base_run_again(make_scheduler, published: Published) -> None:
    """Each entry runs again and again: put back at its due moment on the host's heap, not at an epoch time that
    lies far past every time on it."""
    ASKED.clear()
    scheduler = make_scheduler(entries())
    lead_until_published(scheduler, published, ["plain", "own"], times=3, timeout=20)
    assert all(event.time < time.monotonic() + 60 for event in scheduler._heap), "placed by the host's _when"


@pytest.mark.beat_scheduler("tests.test_host_when:DecimalHeap")
def test_a_host_whose_heap_times_are_not_floats_keeps_running(make_scheduler, published: Published) -> None:
    """Heap times the host gives as Decimals, beside the pass's own floats: a Decimal less a float raised in every
    pass, and the leader stepped down (every replica, in turn)."""
    ASKED.clear()
    scheduler = make_scheduler(entries())
    lead_until_published(scheduler, published, ["plain", "own"], times=3, timeout=20)


@pytest.mark.beat_scheduler("tests.test_host_when:NaNHeap")
def test_a_host_whose_heap_times_are_nan_does_not_spin(make_scheduler, published: Published) -> None:
    """Its entries are placed at now plus their wait, as when the entry's own clock fails. On NaN, every entry
    looked due to the heap in every pass (asked, and put back), and each pass said to wait 0: beat's loop spun."""
    scheduler = make_scheduler({"hourly": every(3600)}, beat_max_loop_interval=30)
    scheduler.wait_in_tick = False  # each tick returns the seconds beat's loop would sleep
    lead(scheduler)
    scheduler.tick()  # the term begins and the heap is built
    waits = [scheduler.tick() for _ in range(5)]
    assert all(wait > 1 for wait in waits), f"the leader's passes returned {waits}: beat's loop spins"
    assert published.headers == []


@pytest.mark.beat_scheduler("tests.test_host_when:RaisingWhen")
def test_a_host_whose_when_raises_keeps_running(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """Its entries are placed at now plus their wait, as when the entry's own clock fails; nothing leaves the pass."""
    ASKED.clear()
    scheduler = make_scheduler(entries())
    lead(scheduler)
    epoch = scheduler.election.epoch
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and min(published.count(n) for n in ("plain", "own")) >= 3,
            timeout=20,
        )
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert scheduler.election.epoch == epoch, "the leader never stepped down"
