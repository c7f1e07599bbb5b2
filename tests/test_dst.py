"""Daylight saving time: crontab entries in a zone with DST, on an injected clock.

The scheduler runs in-process against the real ZooKeeper and Redis, but its
clock is the test's: every crontab gets ``nowfun=clock`` and the test moves
the clock forward by exactly what ``tick()`` says to sleep. Each night is
driven through with a leader handover in the middle of the hour that DST
repeats or skips, so the new leader must get it right from the ledger alone.

What "right" means is what Celery's crontab alone defines, run as a plain
loop on the same clock (the oracle), and spelled out for the fixed-time
entries: in New York, 01:30 on the fall-back night comes once (not again in
the repeated hour). 02:30 on the spring-forward night, a time that does not
exist, depends on the Celery version: before 5.5 Celery compares wall-clock
times, so 02:30 is due as soon as the clock jumps past it (03:00 EDT), and an
hourly entry at :30 runs then and again at 03:30; from 5.5 on it runs once,
at 03:30. Either way each tick carries a slot and task id of its own: the
slot is the moment Celery first calls the tick due.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import celery
import pytest
from celery import Celery, beat
from celery.schedules import crontab

from tests.support.helpers import Published
from zkbeat import Scheduler
from zkbeat.ticking.ticks import delay_to_slot, slot_after

ZONE = ZoneInfo("America/New_York")
HOURS = 5
#: Celery before 5.5 subtracts wall-clock times (one zone), so a skipped time is due when the clock jumps past it.
WALL_CLOCK_CELERY = tuple(celery.VERSION[:2]) < (5, 5)


class Clock:
    """A wall clock the test moves by hand (aware, in ZONE)."""

    def __init__(self, utc: datetime) -> None:
        self.utc = utc

    def __call__(self) -> datetime:
        return self.utc.astimezone(ZONE)

    def advance(self, seconds: float) -> None:
        self.utc += timedelta(seconds=seconds)


def entries(clock: Clock, app: Celery) -> dict:
    def cron(**fields) -> crontab:
        return crontab(nowfun=clock, app=app, **fields)

    return {
        "hourly-30": {"task": "zkbeat.test", "schedule": cron(minute=30)},
        "quarterly": {"task": "zkbeat.test", "schedule": cron(minute="*/15")},
        "at-01-30": {"task": "zkbeat.test", "schedule": cron(hour=1, minute=30)},
        "at-02-30": {"task": "zkbeat.test", "schedule": cron(hour=2, minute=30)},
        # Due a whole real hour less after midnight than its wall time says (spring).
        "at-04-00": {"task": "zkbeat.test", "schedule": cron(hour=4, minute=0)},
    }


def wall(moment: datetime) -> str:
    local = moment.astimezone(ZONE)
    return local.strftime("%H:%M") + local.tzname()


def oracle(start: datetime) -> dict[str, list[str]]:
    """What Celery's crontab alone runs on the same clock, stepped the same way."""
    clock = Clock(start)
    app = Celery("oracle", set_as_current=False)
    app.conf.timezone = str(ZONE)
    runs: dict[str, list[str]] = {}
    for name, spec in entries(clock, app).items():
        clock.utc = start
        last, runs[name] = clock(), []
        while clock.utc < start + timedelta(hours=HOURS):
            due, next_in = spec["schedule"].is_due(last)
            if due:
                runs[name].append(wall(clock.utc))
                last = clock()
            clock.advance(min(max(next_in, 1), 300))
    return runs


UTC = timezone.utc
NIGHTS = {
    # (local midnight, handover): 06:10Z is 01:10 EST, inside the repeated hour
    # (01:30 EDT has run); 06:50Z is 01:50 EST, just before 02:00 becomes 03:00.
    "fall back": (datetime(2024, 11, 3, 4, 0, tzinfo=UTC), datetime(2024, 11, 3, 6, 10, tzinfo=UTC)),
    "spring forward": (datetime(2024, 3, 10, 5, 0, tzinfo=UTC), datetime(2024, 3, 10, 6, 50, tzinfo=UTC)),
}
FIXED = {
    "fall back": {"at-01-30": ["01:30EDT"], "hourly-30": ["00:30EDT", "01:30EDT", "02:30EST", "03:30EST"]},
    "spring forward": {
        "at-01-30": ["01:30EST"],
        "at-04-00": ["04:00EDT"],
        **(
            {
                "at-02-30": ["03:00EDT"],
                "hourly-30": ["00:30EST", "01:30EST", "03:00EDT", "03:30EDT", "04:30EDT", "05:30EDT"],
            }
            if WALL_CLOCK_CELERY
            else {"at-02-30": ["03:30EDT"], "hourly-30": ["00:30EST", "01:30EST", "03:30EDT", "04:30EDT", "05:30EDT"]}
        ),
    },
}


@pytest.mark.parametrize("night", sorted(NIGHTS))
def test_crontab_across_dst_publishes_each_wall_clock_slot_once(
    night: str, make_scheduler, published: Published
) -> None:
    """Across a DST change, with a handover inside the odd hour, zkbeat publishes exactly what crontab defines."""
    start, handover = NIGHTS[night]
    clock = Clock(start)

    def replica(identity: str) -> Scheduler:
        scheduler = make_scheduler(
            lambda app: entries(clock, app), identity=identity, timezone=str(ZONE), beat_max_loop_interval=300
        )
        # The clock is the test's: tick() must return the sleep it wants, not wait it out for run-now requests.
        scheduler._idle = lambda interval: interval
        return scheduler

    def lead_until(scheduler: Scheduler, until: datetime) -> None:
        assert scheduler.election.wait_for_leadership(timeout=15)
        for _ in range(10_000):
            if clock.utc >= until:
                return
            # beat wakes 10 ms early (Celery's drift) and real time moves on;
            # so does this clock, by at least 20 ms a tick.
            delay = max(scheduler.tick(), 0.02)
            clock.advance(min(delay, max((until - clock.utc).total_seconds(), 0.02)))
        raise AssertionError("the scheduler never let the clock reach the end of the night")

    first = replica("before")
    second = None
    try:
        lead_until(first, handover)
        second = replica("after")
        first.close()  # graceful handover inside the odd hour
        lead_until(second, start + timedelta(hours=HOURS))
    finally:
        first.close()
        if second is not None:
            second.close()

    expected = oracle(start)
    zkbeat_headers = [h for h in published.headers if "zkbeat-entry" in h]
    sent = [(h["zkbeat-entry"], datetime.fromisoformat(h["zkbeat-slot"])) for h in zkbeat_headers]
    ordered = sorted(sent, key=lambda item: item[1])
    ran = {name: [wall(slot) for entry, slot in ordered if entry == name] for name in expected}
    for name, slots in ran.items():
        assert len(slots) == len(set(slots)), f"{night}: {name} published a wall-clock slot twice: {slots}"
    task_ids = [h["id"] for h in zkbeat_headers]
    assert len(task_ids) == len(set(task_ids)), f"{night}: a task id was published twice"
    assert ran == expected
    for name, slots in FIXED[night].items():
        assert ran[name] == slots


@pytest.mark.parametrize("night", sorted(NIGHTS))
def test_slot_is_the_moment_celery_next_calls_the_tick_due(night: str) -> None:
    """After each run Celery's crontab makes in the night, the slot zkbeat names next is Celery's next due moment."""
    start, _ = NIGHTS[night]
    clock = Clock(start)
    app = Celery("slots", set_as_current=False)
    app.conf.timezone = str(ZONE)
    end = start + timedelta(hours=HOURS)
    wrong = []
    for name, spec in entries(clock, app).items():
        entry = beat.ScheduleEntry(name=name, task="zkbeat.test", schedule=spec["schedule"], app=app)
        clock.utc = start
        last_run = clock()
        while True:
            # Every due moment here is on a whole minute (ticks and DST changes alike).
            clock.advance(60)
            while clock.utc < end and not spec["schedule"].is_due(last_run).is_due:
                clock.advance(60)
            if clock.utc >= end:
                break
            slot = slot_after(entry, last_run)
            if slot != clock.utc:
                wrong.append(f"{name} after {wall(last_run)}: due at {wall(clock.utc)}, slot {wall(slot)}")
            last_run = clock()
    assert not wrong, f"{night}: " + "; ".join(wrong)


@pytest.mark.parametrize("night", sorted(NIGHTS))
def test_the_wait_after_a_run_ends_when_celery_next_calls_the_tick_due(night: str) -> None:
    """The heap's wait after each run of the night never ends past the next due moment.

    Before Celery 5.5 Celery's own wait is wall-clock time: across the
    spring-forward jump it is an hour too long, and beat would wake past a
    slot (and, for an hourly entry, past the next one too). Across the
    fall-back change it is an hour short: an early wake only asks again.
    """
    start, _ = NIGHTS[night]
    clock = Clock(start)
    app = Celery("waits", set_as_current=False)
    app.conf.timezone = str(ZONE)
    end = start + timedelta(hours=HOURS)
    wrong = []
    for name, spec in entries(clock, app).items():
        entry = beat.ScheduleEntry(name=name, task="zkbeat.test", schedule=spec["schedule"], app=app)
        clock.utc = start
        last_run, woken = clock(), None
        while True:
            # Every due moment here is on a whole minute (ticks and DST changes alike).
            clock.advance(60)
            while clock.utc < end and not spec["schedule"].is_due(last_run).is_due:
                clock.advance(60)
            if clock.utc >= end:
                break
            if woken is not None and woken > clock.utc:
                wrong.append(f"{name} after {wall(last_run)}: due at {wall(clock.utc)}, woken at {wall(woken)}")
            entry.last_run_at = last_run
            is_due, next_time = spec["schedule"].is_due(last_run)
            woken = clock.utc + timedelta(seconds=delay_to_slot(entry, is_due, next_time))
            last_run = clock()
    assert not wrong, f"{night}: " + "; ".join(wrong)


PYTZ_WALLS = [
    # (zone, a time before the change, hours on the wall clock after it)
    ("America/New_York", datetime(2024, 3, 10, 0, 30), [1, 1.5, 2, 2.5, 3, 4]),
    ("America/New_York", datetime(2024, 11, 3, 0, 30), [0.5, 1, 1.5, 2, 3]),
    ("Europe/London", datetime(2024, 3, 31, 0, 15), [0.5, 0.75, 1, 1.25, 2]),
    ("Australia/Lord_Howe", datetime(2024, 10, 6, 1, 0), [0.75, 1, 1.25, 2]),  # a 30-minute jump
]


@pytest.mark.parametrize(("zone", "start", "hours"), PYTZ_WALLS, ids=[f"{z} {s:%m-%d}" for z, s, _ in PYTZ_WALLS])
def test_the_first_instant_of_a_wall_time_is_the_same_with_pytz_and_zoneinfo(zone, start, hours) -> None:
    """django-celery-beat on Django 4.2 can hand Celery pytz zones: slots must not depend on the tz library.

    On Celery before 5.5 a crontab's next wall time is its zone's reading
    plus the time left; with pytz that sum keeps the offset from before the
    change (pytz ignores ``fold``), as Celery computes it.
    """
    import pytz

    from zkbeat.ticking.ticks import _first_instant_at

    pytz_start = pytz.timezone(zone).localize(start)
    zoneinfo_start = start.replace(tzinfo=ZoneInfo(zone))
    for hour in hours:
        later = timedelta(hours=hour)
        expected = _first_instant_at(zoneinfo_start + later)
        assert _first_instant_at(pytz_start + later) == expected, f"{zone} {start} + {hour} h"
