"""What the dashboard says about an entry (pure logic): schedules in words, next fire times with jitter, the
last run's kind and lateness; and the controls' secret, which must never switch them on by accident."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule, solar

from zkbeat.exceptions import ConfigurationError
from zkbeat.ledger.store import EntryState
from zkbeat.ops.dashboard import MIN_SECRET, SECRET_ENV, load_secret
from zkbeat.ops.dashboard.describe import last_run, next_fires, schedule_words
from zkbeat.ticking.jitter import offset

ROOT = "/zkbeat/proj"


def entry(name: str, sched, app: Celery | None = None, **options) -> ScheduleEntry:
    app = app or Celery("describe", set_as_current=False)
    return ScheduleEntry(name=name, task="t", schedule=sched, options=options, app=app)


def test_schedules_read_as_an_operator_says_them() -> None:
    """Intervals in their largest whole unit, a daily crontab as a time in its zone, other crontabs as cron."""
    paris = Celery("paris", set_as_current=False)
    paris.conf.timezone = "Europe/Paris"
    assert schedule_words(entry("a", schedule(timedelta(seconds=30)))) == "every 30 s"
    assert schedule_words(entry("a", schedule(timedelta(minutes=5)))) == "every 5 min"
    assert schedule_words(entry("a", schedule(timedelta(seconds=90)))) == "every 90 s"
    assert schedule_words(entry("a", schedule(timedelta(days=1)))) == "every 1 d"
    assert schedule_words(entry("a", crontab(minute=30, hour=7, app=paris), paris)) == "at 07:30 Europe/Paris"
    assert (
        schedule_words(entry("a", crontab(minute=0, hour=9, day_of_week="mon-fri", app=paris), paris))
        == "at 09:00 Europe/Paris on day-of-week mon-fri"
    )
    assert schedule_words(entry("a", crontab(minute="*/15", app=paris), paris)) == "cron */15 * * * * (Europe/Paris)"
    assert schedule_words(entry("a", solar("sunrise", 48.85, 2.35))) == "at sunrise at (48.85, 2.35)"


def test_next_fires_follow_the_ledger_and_carry_each_slots_jitter() -> None:
    """Five slots from the ledger's last run, each published at slot + the same offset the leader uses."""
    every = entry("report", schedule(timedelta(minutes=10)), zkbeat_jitter=60)
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    state = EntryState(last_run_at=now - timedelta(minutes=3))
    fires = next_fires(every, state, ROOT, 0.0, now)
    slots = [datetime.fromisoformat(f["slot"]) for f in fires]
    assert slots == [now + timedelta(minutes=7 + 10 * i) for i in range(5)]
    for fire, slot in zip(fires, slots):
        assert datetime.fromisoformat(fire["at"]) == slot + timedelta(seconds=offset(ROOT, "report", slot, 60))
        assert not fire["due"]
    # A jitter not below the period is off, as on the leader.
    too_long = entry("x", schedule(30), zkbeat_jitter=30)
    assert all(f["at"] == f["slot"] for f in next_fires(too_long, state, ROOT, 0, now))


def test_a_tick_already_due_comes_first_and_the_rest_go_on_from_now() -> None:
    """A paused or late entry's due slot is shown as due; the following ones count from now, as Celery's rule."""
    every = entry("late", schedule(timedelta(minutes=1)))
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    fires = next_fires(every, EntryState(last_run_at=now - timedelta(minutes=30)), ROOT, 0.0, now)
    assert fires[0]["due"] and datetime.fromisoformat(fires[0]["slot"]) == now - timedelta(minutes=29)
    assert [datetime.fromisoformat(f["slot"]) for f in fires[1:]] == [now + timedelta(minutes=i) for i in (1, 2, 3, 4)]


def test_the_last_run_says_manual_catch_up_or_scheduled_and_how_late() -> None:
    """A run-now is manual; a tick published after its next slot came is a catch-up; lateness counts from its slot."""
    every = entry("e", schedule(timedelta(seconds=10)))
    slot = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    on_time = EntryState(last_run_at=slot, slot=slot, epoch=4, updated_at=slot + timedelta(seconds=0.25))
    assert last_run(on_time, every, ROOT, 0.0) == {
        "slot": slot.isoformat(),
        "published_at": (slot + timedelta(seconds=0.25)).isoformat(),
        "epoch": 4,
        "manual": None,
        "kind": "scheduled",
        "late_seconds": 0.25,
    }
    missed = EntryState(last_run_at=slot, slot=slot, epoch=5, updated_at=slot + timedelta(seconds=42))
    assert last_run(missed, every, ROOT, 0.0)["kind"] == "catch-up"
    assert last_run(missed, every, ROOT, 0.0)["late_seconds"] == 42
    manual = EntryState(last_run_at=slot, slot=slot, epoch=5, updated_at=slot, manual="request-0000000007")
    assert last_run(manual, every, ROOT, 0.0)["kind"] == "manual"
    assert last_run(manual, every, ROOT, 0.0)["late_seconds"] is None
    # Without the app the slot alone is known: lateness counts from it, the kind stays "scheduled".
    assert last_run(missed, None, ROOT, 0.0)["late_seconds"] == 42
    assert last_run(missed, None, ROOT, 0.0)["kind"] == "scheduled"


def test_no_secret_leaves_the_controls_off() -> None:
    """Neither --secret-file nor the variable: no secret, controls off."""
    assert load_secret(None, {}) is None


def test_a_secret_comes_from_the_file_or_the_variable(tmp_path: Path) -> None:
    """The file wins over the variable; surrounding whitespace (a trailing newline) is not part of it."""
    path = tmp_path / "secret"
    path.write_text("s" * MIN_SECRET + "\n")
    assert load_secret(str(path), {SECRET_ENV: "v" * 20}) == "s" * MIN_SECRET
    assert load_secret(None, {SECRET_ENV: "v" * 20}) == "v" * 20


@pytest.mark.parametrize("secret", ["", "   ", "short"])
def test_an_empty_or_short_secret_fails_naming_where_it_came_from(tmp_path: Path, secret: str) -> None:
    """A secret that is set but empty or short is an error that names its source (never a silent off or on)."""
    with pytest.raises(ConfigurationError, match=SECRET_ENV):
        load_secret(None, {SECRET_ENV: secret})
    path = tmp_path / "secret"
    path.write_text(secret)
    with pytest.raises(ConfigurationError, match="--secret-file"):
        load_secret(str(path), {})
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_secret(str(tmp_path / "missing"), {})
