"""Within a pass, DatabaseScheduler.is_due answers an interval row as django-celery-beat's own is_due does.

Django's clock and the pass's are held still, so both read the same instant: rows every 1 s to a day, due a microsecond,
half a second or hours either side of now, with the app, Django and DJANGO_CELERY_BEAT_TZ_AWARE in
various zones and modes, across both DST changes of 2026 (New York, Paris).
"""

from __future__ import annotations

import heapq
import itertools
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.djangosupport import ON_THE_DATABASE, interval_task
from tests.support.helpers import lead
from zkbeat.leading.heap_pass import HEAP_LAG

pytestmark = ON_THE_DATABASE


@pytest.mark.parametrize("app_tz", ["UTC", "America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize("dj_tz", ["UTC", "Europe/Paris"])
@pytest.mark.parametrize("frozen_at", ["2026-12-02T08:00:00", "2026-11-01T05:30:00", "2026-03-29T01:00:00.5"])
@pytest.mark.parametrize("aware", [True, False])
def test_a_pass_answers_an_interval_rows_is_due_as_django_celery_beat_does(
    make_scheduler, monkeypatch, app_tz, dj_tz, frozen_at, aware
):
    from django.test import override_settings
    from django_celery_beat.models import PeriodicTask

    from zkbeat.contrib.django import ModelEntry

    frozen = datetime.fromisoformat(frozen_at).replace(tzinfo=timezone.utc)
    with override_settings(TIME_ZONE=dj_tz, DJANGO_CELERY_BEAT_TZ_AWARE=aware):
        from django.utils import timezone as djtz

        monkeypatch.setattr(djtz, "now", lambda: frozen)
        from zkbeat.ticking import passclock

        class FrozenDatetime(datetime):  # the pass's reading of the same instant (its rows are answered from it)
            @classmethod
            def now(cls, tz=None):
                return frozen.astimezone(tz) if tz is not None else frozen.replace(tzinfo=None)

        monkeypatch.setattr(passclock, "datetime", FrozenDatetime)
        names = []
        for n, (every, off) in enumerate(
            itertools.product([1, 60, 3600, 86400], [-1, -0.000001, 0, 0.000001, 0.5, 1, 7200])
        ):
            name = f"r{n}"
            interval_task(name, every, last_run_at=frozen - timedelta(seconds=every + off))
            names.append(name)
        scheduler = make_scheduler(timezone=app_tz)
        bad = []
        from zkbeat.contrib import _heap

        hits = []
        orig = _heap.Placer.due_in
        monkeypatch.setattr(_heap.Placer, "due_in", lambda self, e: hits.append(orig(self, e)) or hits[-1])
        for name in names:
            model = PeriodicTask.objects.get(name=name)
            entry = ModelEntry(model, app=scheduler.app)
            scheduler.pass_clock.start()
            try:
                ours = tuple(scheduler.is_due(entry))
            finally:
                scheduler.pass_clock.stop()
            theirs = tuple(entry.is_due())
            if ours != theirs:
                bad.append((name, model.interval.every, str(model.last_run_at), ours, theirs))
        assert not bad, bad
        assert any(h is not None for h in hits), hits


def _rows_asked_again_in_one_pass(make_scheduler, monkeypatch, names, last, *, slow_before, unpacked=False):
    """Hourly interval rows last run at ``last``, led; then every one taken off the heap in one pass, each answer
    5 ms apart (the sleep before each answer, or after it), each "not yet" (30 minutes): the scheduler after it.

    ``unpacked``: is_due hands on DatabaseScheduler's answer as a plain ``(is_due, next_time)`` tuple, as a subclass
    that looks at it (``is_due, next_time = super().is_due(entry)``) returns it."""
    for name in names:
        interval_task(name, 3600, last_run_at=last)
    scheduler = make_scheduler(beat_max_loop_interval=5)
    scheduler.wait_in_tick = False
    lead(scheduler)
    scheduler.tick()  # the term begins, the rows are read and the heap is built
    assert scheduler._heap is not None and set(names) <= {event.entry.name for event in scheduler._heap}
    answer = scheduler.is_due

    def slow_answer(entry):
        if slow_before:
            time.sleep(0.005)  # the pass takes a while before each answer (as over the rows asked before them)
        try:
            if unpacked:
                is_due, next_time = answer(entry)
                return is_due, next_time
            return answer(entry)
        finally:
            if not slow_before:
                time.sleep(0.005)  # the pass takes a while over each row (its clock read once, before them all)

    monkeypatch.setattr(scheduler, "is_due", slow_answer)
    # Every row looked at again in one pass (as when placed early): each answers "not yet", 30 minutes.
    scheduler._heap = [event._replace(time=0.0) if event.entry.name in names else event for event in scheduler._heap]
    heapq.heapify(scheduler._heap)
    scheduler.tick()
    return scheduler


def test_an_interval_row_answered_from_the_pass_s_reading_goes_back_on_the_heap_from_it(
    make_scheduler, published, monkeypatch
):
    """A plain interval row the pass answers "not yet" from its one reading goes back on the heap by that reading.

    Its wait counts from the reading (zkbeat.contrib._heap), not from the moment its own clock would have
    answered: counted from the moment the pass asked it, a row asked late in a long pass (a burst, a heap of
    100,000 rows) was placed late by the time the pass had taken so far, published that much late, and (an
    interval counting from its last run) every later run with it.
    """
    last = datetime.now(timezone.utc) - timedelta(minutes=30)
    names = [f"row-{n:02d}" for n in range(30)]
    scheduler = _rows_asked_again_in_one_pass(make_scheduler, monkeypatch, names, last, slow_before=False)
    due = (last + timedelta(hours=1)).timestamp() + HEAP_LAG
    late = sorted(
        ((event.time - due, event.entry.name) for event in scheduler._heap if event.entry.name in names), reverse=True
    )
    assert len(late) == len(names)
    assert late[0][0] < 0.05, f"placed late by up to {late[0][0]:.3f}s: {late[:3]}"
    assert published.headers == []


def test_an_interval_row_answered_from_the_pass_s_reading_through_a_subclass_s_is_due_goes_back_from_it(
    make_scheduler, published, monkeypatch
):
    """A subclass's is_due that unpacks DatabaseScheduler's answer and returns it as a plain tuple does not change
    where the row goes back on the heap: its wait was still counted from the pass's reading.

    Taken for an answer of the row's own clock, its wait counted from the moment the pass asked it: a row asked late
    in a long pass was placed late by the time the pass had taken so far (and published that much late).
    """
    last = datetime.now(timezone.utc) - timedelta(minutes=30)
    names = [f"row-{n:02d}" for n in range(30)]
    scheduler = _rows_asked_again_in_one_pass(
        make_scheduler, monkeypatch, names, last, slow_before=False, unpacked=True
    )
    due = (last + timedelta(hours=1)).timestamp() + HEAP_LAG
    late = sorted(
        ((event.time - due, event.entry.name) for event in scheduler._heap if event.entry.name in names), reverse=True
    )
    assert len(late) == len(names)
    assert late[0][0] < 0.05, f"placed late by up to {late[0][0]:.3f}s: {late[:3]}"
    assert published.headers == []


def _earliest(scheduler, names, due):
    """(seconds before ``due`` plus beat's lag, name) of the rows placed earliest on the heap, earliest first."""
    return sorted(
        ((due + HEAP_LAG - event.time, event.entry.name) for event in scheduler._heap if event.entry.name in names),
        reverse=True,
    )


def test_rows_placed_when_the_heap_is_rebuilt_late_in_a_pass_are_not_placed_early(
    make_scheduler, published, monkeypatch
):
    """A heap rebuilt after the pass spent a while (settling claims, checking runs, run-now requests) places each row
    at its due moment, not before it.

    The pass's clock was read as it began; beat's heap times are counted from that reading. A plain interval row's
    wait was counted from Django's clock read at the rebuild (zkbeat.contrib._heap), and a row django-celery-beat
    answers itself (a start time) from its own clock then: each placed early by the time the pass had spent, taken
    off the heap that early and asked again in vain (after a takeover, every row of the schedule once).
    """
    last = datetime.now(timezone.utc) - timedelta(minutes=30)
    plain = [f"row-{n:02d}" for n in range(20)]
    started = [f"started-{n:02d}" for n in range(5)]
    for name in plain:
        interval_task(name, 3600, last_run_at=last)
    for name in started:
        interval_task(name, 3600, last_run_at=last, start_time=last - timedelta(days=1))
    scheduler = make_scheduler(beat_max_loop_interval=5)
    scheduler.wait_in_tick = False
    lead(scheduler)
    scheduler.tick()  # the term begins, the rows are read and the heap is built
    names = set(plain + started)
    assert scheduler._heap is not None and names <= {event.entry.name for event in scheduler._heap}
    term = scheduler.term
    new_pass = term.new_pass

    def slow_start():
        new_pass()
        time.sleep(0.1)  # what the pass does before the heap is rebuilt takes a while

    monkeypatch.setattr(term, "new_pass", slow_start)
    scheduler.invalidate_heap()
    scheduler.tick()
    assert scheduler._heap is not None and scheduler.term is term
    early = _earliest(scheduler, names, (last + timedelta(hours=1)).timestamp())
    assert len(early) == len(names)
    assert early[0][0] < HEAP_LAG / 2, f"placed early by up to {early[0][0]:.3f}s: {early[:3]}"
    assert published.headers == []


def test_interval_rows_answered_after_a_slow_start_of_a_pass_are_not_placed_early(
    make_scheduler, published, monkeypatch
):
    """Plain interval rows the pass answers "not yet" go back on the heap at their due moment, however long the pass
    took before it first asked one.

    The rows are answered by arithmetic from one reading of the clock (zkbeat.contrib._heap) and go back on the
    heap from the pass's reading: the two must be the same reading. Django's clock read at the first row asked (after
    rows asked on their own clocks, a crontab's, a start time's), every row was placed early by the time between the
    two, taken off the heap that early and asked again in vain.
    """
    last = datetime.now(timezone.utc) - timedelta(minutes=30)
    names = [f"row-{n:02d}" for n in range(30)]
    scheduler = _rows_asked_again_in_one_pass(make_scheduler, monkeypatch, names, last, slow_before=True)
    early = _earliest(scheduler, names, (last + timedelta(hours=1)).timestamp())
    assert len(early) == len(names)
    assert early[0][0] < HEAP_LAG / 2, f"placed early by up to {early[0][0]:.3f}s: {early[:3]}"
    assert published.headers == []


def test_a_takeover_places_every_row_at_its_due_moment_not_before(make_scheduler, published):
    """At a takeover the first pass checks every row's own last run before it builds the heap (thousands of rows:
    milliseconds); the heap's times count from the pass's reading, taken before that. Counted from Django's clock
    read after it, every row went on the heap that much early (5,000 rows: ~6 ms, beat's lag is 1 ms) and was
    asked once more in vain at its first due moment.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    last = datetime.now(timezone.utc) - timedelta(minutes=30)
    every, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    names = [f"row-{n:05d}" for n in range(5000)]
    PeriodicTask.objects.bulk_create(
        [PeriodicTask(name=name, task="jobs.cleanup_messages", interval=every, last_run_at=last) for name in names]
    )
    scheduler = make_scheduler(beat_max_loop_interval=5)
    scheduler.wait_in_tick = False
    lead(scheduler)
    scheduler.tick()  # the term begins, the rows are read and the heap is built
    assert scheduler._heap is not None
    early = _earliest(scheduler, set(names), (last + timedelta(hours=1)).timestamp())
    assert len(early) == len(names)
    assert early[0][0] < HEAP_LAG / 2, f"placed early by up to {early[0][0]:.4f}s: {early[:3]}"
    assert published.headers == []
