"""Where beat's heap puts each entry of a database schedule, for 100,000 entries at once.

Celery places an entry by asking it ``is_due()`` and then ``_when()``, and
each asks its own clock: ~100 µs an entry, ten seconds for 100,000 at a
takeover, before the first publish. Nearly every row of a large schedule is
an enabled interval task with no start time, expiry or one-off flag, and for
those the answer is arithmetic: Celery's own ``remaining()`` of the row's
last run and its period, against one reading of the clock for all of them.
Every other entry is asked the way Celery asks it.

The heap only says when to look: an entry popped from it is asked
``is_due()`` again before it runs, so a placement can make the leader look
early (and put the entry back), never run it early. Both readings (the
schedule's now and the heap's) are of the same moment (in a leader's pass,
its one reading: zkbeat.ticking.passclock), so an entry is placed at its due
time, neither late by the time the placing took nor early by the time the
pass took before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery import beat, schedules
from celery.utils.time import maybe_make_aware, remaining

__all__ = ["Placer"]


class Placer:
    """Heap events for entries of one scheduler, with the clocks read once.

    Each event gets a priority of its own from ``ties`` (Celery gives every
    entry 5): a heap event is (time, priority, entry), and with 10,000
    entries due at the same moment Celery's heap would break every tie by
    comparing entries (their task, arguments, options and schedule) instead.
    The priority is only ever a tie-breaker; zkbeat hands it back unchanged.
    """

    def __init__(self, scheduler: Any, entry_class: type, ties: Iterator[int]) -> None:
        self.scheduler = scheduler
        self.entry_class = entry_class
        self.ties = ties
        self._base: float | None = None  # beat's heap clock (Celery's _when) now
        self._now: dict[Any, Any] = {}  # a schedule's now, per clock function
        self._zones: dict[int, Any] = {}

    def event(self, entry: beat.ScheduleEntry) -> beat.event_t:
        delay = self.due_in(entry)
        if delay is None:
            # From the moment the row's own clock answered (zkbeat.leading.heap_pass), not the pass's earlier reading.
            return beat.event_t(self.scheduler.heap_time(entry, self.scheduler.ask(entry)), next(self.ties), entry)
        if self._base is None:
            self._base = self.scheduler._when_safe(entry, 0)
        return beat.event_t(self._base + (self.scheduler.adjust(delay) or 0), next(self.ties), entry)

    def due_in(self, entry: beat.ScheduleEntry) -> float | None:
        """Seconds until an enabled plain interval row is due (its is_due, by arithmetic); None otherwise."""
        if type(entry) is not self.entry_class:
            return None
        model = entry.model
        schedule = entry.schedule
        if (
            type(schedule) is not schedules.schedule
            or schedule.relative
            or not model.enabled
            or model.start_time is not None
            or model.expires is not None
            or model.one_off
        ):
            return None
        last_run_at = entry.last_run_at
        if last_run_at is None or last_run_at.tzinfo is None:
            return None
        try:
            now = self._schedule_now(schedule)
            if now is None:
                return None
            start = maybe_make_aware(last_run_at).astimezone(self._zone(entry))
            return max(remaining(start, schedule.run_every, now, False).total_seconds(), 0.0)
        except Exception:  # noqa: BLE001 - the entry's own is_due will say what is wrong
            return None

    def _schedule_now(self, schedule: schedules.schedule) -> Any:
        """The schedule's now, read once per clock function (django-celery-beat's rows share one)."""
        code = getattr(schedule.nowfun, "__code__", None)
        if code is None or schedule.nowfun.__closure__ or schedule.nowfun.__defaults__:
            return None  # no clock of its own (the app's), or one that may differ per schedule: ask the entry
        if code not in self._now:
            now = schedule.maybe_make_aware(schedule.now())
            clock = getattr(self.scheduler, "pass_clock", None)
            reading = clock.now() if clock is not None and code in clock.real_clocks else None
            if reading is not None and now.tzinfo is not None:
                # In a pass, the pass's reading, told in the zone the clock answers in: beat's heap times are
                # counted from that reading (_base, heap_pass._push), so the waits must be too. Counted from this
                # later read, each row went on the heap early by the time between the two (the pass's work
                # before a rebuild, the rows asked before the first of these) and was asked again in vain.
                now = reading.astimezone(now.tzinfo)
            self._now[code] = now
        return self._now[code]

    def _zone(self, entry: beat.ScheduleEntry) -> Any:
        app = entry.app
        zone = self._zones.get(id(app))
        if zone is None:
            zone = self._zones[id(app)] = app.timezone
        return zone
