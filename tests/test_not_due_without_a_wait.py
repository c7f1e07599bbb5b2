"""A schedule that says "not due" with no time to wait (0, less, NaN) must not spin the leader.

Celery's own schedules never answer so (not due means time is left), a
custom one may. A leader's heap put the entry back due at once, and every
pass after asked it again and returned 0: beat's loop turned as fast as it
could, for ever. It is asked again after RETRY_DELAY instead.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta
from decimal import Decimal

import pytest
from celery import schedules

from tests.support.helpers import Published, every, lead, lead_until_published
from zkbeat.leading import heap_pass

#: is_due() calls, by answer (beat may copy the schedule: the count is kept here).
ASKED: Counter = Counter()


class NeverDue(schedules.schedule):
    """Never due, and says to look again in ``answer`` seconds."""

    def __init__(self, answer: float) -> None:
        super().__init__(timedelta(hours=1))
        self.answer = answer

    def is_due(self, last_run_at):
        ASKED[repr(self.answer)] += 1
        return schedules.schedstate(False, self.answer)

    def __reduce__(self):
        return (self.__class__, (self.answer,))


@pytest.mark.parametrize("answer", [0, -1.0, math.nan], ids=["zero", "negative", "nan"])
def test_a_schedule_never_due_with_no_time_left_is_asked_again_after_a_while_not_in_every_pass(
    make_scheduler, published: Published, answer: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's passes each return a wait (beat's loop sleeps), and the entry is not asked in each of them."""
    monkeypatch.setattr(heap_pass, "RETRY_DELAY", 3600.0)  # the wait is then beat's max interval: 30 s
    never = NeverDue(answer)
    scheduler = make_scheduler(
        {"never": {"task": "zkbeat.test", "schedule": never}, "plain": every(3600)}, beat_max_loop_interval=30
    )
    scheduler.wait_in_tick = False  # each tick returns the seconds beat's loop would sleep
    lead(scheduler)
    scheduler.tick()  # the term begins and the heap is built
    ASKED.clear()
    waits = [scheduler.tick() for _ in range(5)]
    assert all(wait > 1 for wait in waits), f"the leader's passes returned {waits}: beat's loop spins"
    assert ASKED[repr(answer)] <= 1, f"asked {ASKED[repr(answer)]} times in 5 passes"
    assert published.headers == []


class DueAfterNaN(schedules.schedule):
    """Answers "not due, NaN seconds" at first, then due (every hour); its answers are counted in ASKED."""

    def __init__(self) -> None:
        super().__init__(timedelta(hours=1))

    def is_due(self, last_run_at):
        ASKED["then-due"] += 1
        if ASKED["then-due"] <= 2:
            return schedules.schedstate(False, math.nan)
        return schedules.schedstate(True, 3600.0)

    def __reduce__(self):
        return (self.__class__, ())


def test_an_entry_whose_schedule_answered_nan_is_asked_again_and_runs_once_due(
    make_scheduler, published: Published
) -> None:
    """A NaN on beat's heap sinks below the other entries and is never popped again (no time is past NaN): the
    entry was never asked again, nor run."""
    ASKED.clear()
    entries = {"then-due": {"task": "zkbeat.test", "schedule": DueAfterNaN()}, "hourly": every(3600)}
    scheduler = make_scheduler(entries)
    lead_until_published(scheduler, published, ["then-due"], timeout=20)
    assert published.count("then-due") == 1


class DueWithNaN(schedules.schedule):
    """Due at every ask (a slot every 0.2 s), its next look in NaN seconds (counted in ASKED)."""

    def __init__(self) -> None:
        super().__init__(timedelta(seconds=0.2))

    def is_due(self, last_run_at):
        ASKED["due-nan"] += 1
        return schedules.schedstate(True, math.nan)

    def __reduce__(self):
        return (self.__class__, ())


def test_an_entry_run_with_a_nan_next_look_is_asked_again(make_scheduler, published: Published) -> None:
    """After its run the entry went back on beat's heap NaN seconds on, and sank there for good: run once, never
    again. It is asked again after beat's max interval instead (and, due again, runs again)."""
    entries = {"due-nan": {"task": "zkbeat.test", "schedule": DueWithNaN()}, "hourly": every(3600)}
    scheduler = make_scheduler(entries)
    lead_until_published(scheduler, published, ["due-nan"], times=2, timeout=20)


@pytest.mark.parametrize("answer", [0, -1.0, math.nan], ids=["zero", "negative", "nan"])
def test_a_schedule_never_due_with_no_time_left_is_asked_again_after_the_retry_delay_not_beat_s_max_interval(
    make_scheduler, answer: float
) -> None:
    """The CHANGELOG's "asked again after 1 s": the test above passes with beat's max interval too (its
    RETRY_DELAY is patched above it), and the suite's max interval (0.5 s) is below RETRY_DELAY."""
    scheduler = make_scheduler(
        {"never": {"task": "zkbeat.test", "schedule": NeverDue(answer)}, "plain": every(3600)},
        beat_max_loop_interval=30,
    )
    scheduler.wait_in_tick = False
    lead(scheduler)
    scheduler.tick()  # the term begins and the heap is built: "never" placed RETRY_DELAY on
    wait = scheduler.tick()
    assert 0 < wait <= heap_pass.RETRY_DELAY + heap_pass.HEAP_LAG, f"the next pass comes {wait}s on"
    assert scheduler._heap[0][2].name == "never"


class NeverDueIncomparable(schedules.schedule):
    """Never due; its wait is a Decimal NaN, which ``>`` refuses with InvalidOperation (not a TypeError)."""

    def __init__(self) -> None:
        super().__init__(timedelta(hours=1))

    def is_due(self, last_run_at):
        ASKED["incomparable"] += 1
        return schedules.schedstate(False, Decimal("NaN"))

    def __reduce__(self):
        return (self.__class__, ())


def test_a_not_due_answer_whose_wait_cannot_be_compared_leaves_the_term_and_the_other_entries_alone(
    make_scheduler, published: Published
) -> None:
    """One entry's odd answer must not end the leader's term in every pass (every replica's, in turn): the
    schedule would stop. Its wait is not a number: it is asked again after beat's max interval, as before."""
    entries = {"odd": {"task": "zkbeat.test", "schedule": NeverDueIncomparable()}, "often": every(0.2)}
    scheduler = make_scheduler(entries)
    lead_until_published(scheduler, published, ["often"], times=3, timeout=20)
    assert published.count("odd") == 0
