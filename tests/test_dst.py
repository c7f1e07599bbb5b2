"""Daylight saving time: crontab entries in a zone with DST, on an injected clock.

The scheduler runs in-process against the real ZooKeeper and Redis, but its
clock is the test's: every crontab gets ``nowfun=clock`` and the test moves
the clock forward by exactly what ``tick()`` says to sleep. Each night is
driven through with a leader handover in the middle of the hour that DST
repeats or skips, so the new leader must get it right from the ledger alone.

What "right" means is what Celery's crontab alone defines, run as a plain
loop on the same clock (the oracle), and spelled out for the fixed-time entry:
in New York, 01:30 on the fall-back night comes once (not again in the
repeated hour), and 02:30 on the spring-forward night, a time that does not
exist, runs at 03:30.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from tests.support.helpers import Published
from zkbeat import Scheduler

ZONE = ZoneInfo("America/New_York")
HOURS = 5


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
    "spring forward": {"at-02-30": ["03:30EDT"], "at-01-30": ["01:30EST"]},
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
    assert ran == expected
    for name, slots in FIXED[night].items():
        assert ran[name] == slots
