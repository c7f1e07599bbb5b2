"""One reading of the clock for a whole pass of the leader's loop.

Celery asks an entry's clock on every ``is_due()`` and every ``_when()``
(beat's heap timestamp), and its clock is ``app.now()``: a time zone
conversion with an ambiguity check, ~10 µs. A leader's pass asks about
seven times per tick it publishes, a quarter of its CPU in a steady run.
Within one pass every answer is wanted as of the moment the pass looked at
the heap (an entry that comes due while the pass publishes is seen by the
next pass, which comes at once), so the clock is read once when the pass
begins and every entry that goes by the app's own clock is answered from
that reading, by Celery's own arithmetic:

* ``_when(entry, delay)``: the reading's timestamp plus the delay, exactly
  as Celery computes it from ``entry.default_now()``;
* ``default_now()`` (what ``reserve()`` makes the entry's last run);
* ``is_due()`` of a plain interval (``celery.schedules.schedule``, not
  ``relative``): Celery's ``remaining()`` of the entry's last run against
  the reading, expressed in the schedule app's zone as ``app.now()`` would.

An entry with a clock of its own (a ``nowfun``, an entry, schedule or app
class that overrides ``now``), and every other schedule (crontab, solar,
custom), is asked the way Celery asks it. A host may name clocks it knows
read the real time (``real_clocks``: the code of a ``nowfun``, such as
django-celery-beat's interval schedules'): for an entry on one, ``_when``
is answered from the reading too (only the instant counts there, not the
zone it is told in). Used from beat's thread only.
"""

from __future__ import annotations

import time
from calendar import timegm
from datetime import datetime, timedelta, timezone
from typing import Any

import celery
from celery import Celery, beat, schedules
from celery.utils.time import remaining

from .ticks import interval_aware

__all__ = ["PassClock"]


class PassClock:
    """The clock of one pass: :meth:`start` reads it, :meth:`stop` lets every entry ask its own again."""

    def __init__(self) -> None:
        self._utc: datetime | None = None
        self._stamp = 0.0
        #: time.monotonic() at the reading.
        self._mono = 0.0
        #: The reading in each app's zone, as its now() would give it (per pass).
        self._local: dict[int, datetime] = {}
        #: Whether an (entry class, schedule class) pair goes by the app's clock.
        self._plain: dict[tuple[type, type], bool] = {}
        #: Each schedule's answer of _app this pass (Celery's reserve() hands the schedule on), by id, kept alive.
        self._apps: dict[int, tuple[Any, Any, type]] = {}
        #: Code objects of ``nowfun`` clocks known to read the real time (in some zone): see the module docstring.
        self.real_clocks: set[Any] = set()

    @property
    def running(self) -> bool:
        return self._utc is not None

    def start(self) -> datetime:
        """Read the clock for this pass; returns the reading (UTC)."""
        utc = datetime.now(timezone.utc)
        self._utc = utc
        self._mono = time.monotonic()
        # Celery's _when: timegm of the UTC time tuple plus the microseconds.
        self._stamp = timegm(utc.utctimetuple()) + utc.microsecond / 1e6
        self._local.clear()
        self._apps.clear()
        return utc

    def stop(self) -> None:
        self._utc = None
        self._local.clear()
        self._apps.clear()

    def now(self) -> datetime | None:
        """The pass's reading (UTC), or None outside a pass."""
        return self._utc

    def now_for(self, entry: beat.ScheduleEntry) -> datetime | None:
        """``entry.default_now()`` from the pass's reading (in the schedule app's zone); None: ask the entry."""
        if self._utc is None:
            return None
        app = self._app(entry)
        return None if app is None or app is _REAL_CLOCK else self._in_zone(app)

    def when(self, entry: beat.ScheduleEntry, adjusted: float) -> float | None:
        """Celery's ``_when(entry, delay)`` from the reading (``adjusted``: beat's adjust(delay)); None: ask Celery."""
        if self._utc is None or self._app(entry) is None:
            return None
        return self._stamp + (adjusted or 0)

    def when_from(self, entry: beat.ScheduleEntry, adjusted: float, moment: float) -> float | None:
        """:meth:`when` for a wait counted from ``moment`` (monotonic, later than the reading); None: ask Celery.

        Where :meth:`when` answers, the entry's clock is the reading's: the
        reading moved on by the time since it was taken is that clock at
        ``moment``, without reading it again.
        """
        base = self.when(entry, adjusted)
        return None if base is None else base + max(0.0, moment - self._mono)

    def is_due(self, entry: beat.ScheduleEntry) -> tuple[bool, float] | None:
        """Celery's ``entry.is_due()`` for a plain interval, from the pass's reading; None: ask Celery."""
        if self._utc is None:
            return None
        schedule = entry.schedule
        if type(schedule) is not schedules.schedule or schedule.relative or type(entry).is_due is not _IS_DUE:
            return None
        app = self._app(entry)
        if app is None or app is _REAL_CLOCK:
            return None
        # celery.schedules.schedule.is_due, its non-relative branch.
        last_run_at = interval_aware(schedule, entry.last_run_at)
        if _REAL_TIME_REMAINING and isinstance(schedule.run_every, timedelta):
            # celery.utils.time.remaining as Celery 5.5 and later computes it: real time, in UTC.
            end = last_run_at.astimezone(timezone.utc) + timedelta(seconds=schedule.run_every.total_seconds())
            left = max((end - self._utc).total_seconds(), 0)
        else:
            left = max(remaining(last_run_at, schedule.run_every, self._in_zone(app), False).total_seconds(), 0)
        if left == 0:
            return True, schedule.seconds
        return False, left

    def _in_zone(self, app: Any) -> datetime:
        """The reading as ``app.now()`` gives it (in the app's zone)."""
        now = self._local.get(id(app))
        if now is None:
            now = self._local[id(app)] = self._utc.astimezone(app.timezone)  # type: ignore[union-attr]
        return now

    def _app(self, entry: beat.ScheduleEntry) -> Any:
        """The app whose own ``now()`` the entry's clock is, or None if it has a clock of its own."""
        schedule = entry.schedule
        known = self._apps.get(id(schedule))
        if known is not None and known[0] is schedule and type(entry) is known[2]:
            return known[1]
        app = self._app_of(entry, schedule)
        self._apps[id(schedule)] = (schedule, app, type(entry))
        return app

    def _app_of(self, entry: beat.ScheduleEntry, schedule: Any) -> Any:
        if not schedule:
            return None
        kinds = (type(entry), type(schedule))
        plain = self._plain.get(kinds)
        if plain is None:
            plain = self._plain[kinds] = (
                kinds[0].default_now is _DEFAULT_NOW and getattr(kinds[1], "now", None) is _SCHEDULE_NOW
            )
        if not plain:
            return None
        nowfun = getattr(schedule, "nowfun", None)
        if nowfun is not None:
            # A clock of its own: the pass's reading gives its instant (``when``), not its zone.
            code = getattr(nowfun, "__code__", None)
            return _REAL_CLOCK if code is not None and code in self.real_clocks else None
        app = schedule.app
        if type(app).now is not _APP_NOW or "now" in vars(app):
            return None
        return app


#: What _app answers for an entry on one of ``real_clocks``: the reading's instant is its clock's, its zone unknown.
_REAL_CLOCK = object()
#: Celery 5.5 and later count an interval's time left in real time (UTC); older ones on the wall clock.
_REAL_TIME_REMAINING = tuple(celery.VERSION[:2]) >= (5, 5)
_IS_DUE = beat.ScheduleEntry.is_due
_DEFAULT_NOW = beat.ScheduleEntry.default_now
_SCHEDULE_NOW = schedules.BaseSchedule.now
_APP_NOW = Celery.now
