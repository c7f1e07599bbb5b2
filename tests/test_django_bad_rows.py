"""zkbeat.DatabaseScheduler with bad rows written around the admin: each is logged once and left out.

Each test puts one bad row beside a good 1 s task on real PostgreSQL,
ZooKeeper and Redis (the bad row written with raw SQL, as a script or a
migration would, so that no model check and no change signal runs), and
checks that the good task keeps being published and that exactly one log
line names the bad row, across passes and re-reads of the schedule.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from tests.support.djangosupport import ON_THE_DATABASE, interval_task, periodic_task, pump
from tests.support.helpers import Published, lead, wait_for
from tests.support.processes import leader_epochs

pytestmark = ON_THE_DATABASE


UNKNOWN_ZONE = "Mars/Olympus_Mons"


def write_around_the_admin(table: str, pk: int, **columns) -> None:
    """Set columns of one row with raw SQL: no model checks, no change signal."""
    from django.db import connection

    assignments = ", ".join(f'"{column}" = %s' for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE "django_celery_beat_{table}" SET {assignments} WHERE id = %s', [*columns.values(), pk])


def lines_naming(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.ERROR) -> list[str]:
    """The log lines at ``level`` or above (zkbeat's, django-celery-beat's or Celery's) that contain ``text``."""
    return [r.getMessage() for r in caplog.records if r.levelno >= level and text in r.getMessage()]


def no_step_down(caplog: pytest.LogCaptureFixture) -> None:
    stepped = [r.getMessage() for r in caplog.records if "stopped leading" in r.getMessage()]
    assert stepped == [], stepped


def keeps_running(scheduler, published: Published, name: str = "good", more: int = 3) -> None:
    """Pump until ``name`` was published ``more`` times again, through a full re-read of the schedule."""
    from django_celery_beat.models import PeriodicTasks

    start = published.count(name)
    pump(scheduler, lambda: published.count(name) >= start + more)
    PeriodicTasks.update_changed()  # as any admin edit would: the leader reads the rows that changed
    start = published.count(name)
    pump(scheduler, lambda: published.count(name) >= start + more)


# -- rows that cannot load -------------------------------------------------


def test_an_unknown_time_zone_on_a_crontab_no_task_uses(make_scheduler, published: Published, caplog) -> None:
    """A crontab row with a time zone nobody knows, used by no task, is logged once; the good task runs."""
    from django_celery_beat.models import CrontabSchedule

    interval_task("good", 1)
    unused = CrontabSchedule.objects.create(minute="0", hour="4")
    write_around_the_admin("crontabschedule", unused.pk, timezone=UNKNOWN_ZONE)
    scheduler = make_scheduler()
    lead(scheduler)
    keeps_running(scheduler, published)
    assert len(lines_naming(caplog, UNKNOWN_ZONE, logging.WARNING)) == 1, caplog.text
    no_step_down(caplog)


@pytest.mark.parametrize("zone", [UNKNOWN_ZONE, "", "../../etc/passwd"])
def test_a_task_on_a_crontab_with_an_unknown_time_zone_is_left_out(
    make_scheduler, published: Published, caplog, zone: str
) -> None:
    """A task whose crontab has an unknown (or no) time zone is left out with one error naming it."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    interval_task("good", 1)
    every_minute = CrontabSchedule.objects.create(minute="*")
    PeriodicTask.objects.create(name="on-mars", task="jobs.cleanup_messages", crontab=every_minute)
    write_around_the_admin("crontabschedule", every_minute.pk, timezone=zone)
    scheduler = make_scheduler()
    lead(scheduler)
    keeps_running(scheduler, published)
    assert "on-mars" not in scheduler.schedule
    errors = lines_naming(caplog, "on-mars", logging.WARNING)
    assert len(errors) == 1 and "time zone" in errors[0], caplog.text
    no_step_down(caplog)


def test_a_crontab_that_loses_its_time_zone_while_loaded(make_scheduler, published: Published, caplog) -> None:
    """A loaded task whose crontab row turns bad: its run times still reach the row, the good task runs on."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask

    interval_task("good", 1)
    every_minute = CrontabSchedule.objects.create(minute="*")
    task = PeriodicTask.objects.create(name="on-mars", task="jobs.cleanup_messages", crontab=every_minute)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("good") >= 2)
    write_around_the_admin("crontabschedule", every_minute.pk, timezone=UNKNOWN_ZONE)
    scheduler._dirty.add("on-mars")  # as if it had just run: the next sync writes its row
    keeps_running(scheduler, published)
    assert "on-mars" not in scheduler.schedule
    assert len(lines_naming(caplog, "on-mars")) == 1, caplog.text
    assert periodic_task("good").last_run_at is not None
    assert PeriodicTask.objects.filter(pk=task.pk).values_list("last_run_at", flat=True)[0] is not None
    no_step_down(caplog)


@pytest.mark.parametrize(
    ("field", "value"),
    [("args", '["unclosed"'), ("kwargs", "not json"), ("kwargs", "[1, 2]"), ("args", '{"a": 1}'), ("headers", "[]")],
)
def test_arguments_that_are_not_json_of_the_right_type(
    make_scheduler, published: Published, caplog, field: str, value: str
) -> None:
    """A task whose args, kwargs or headers are not JSON (or not a list/object) is left out, logged once, not edited."""
    interval_task("good", 1)
    bad = interval_task("garbled", 1)
    write_around_the_admin("periodictask", bad.pk, **{field: value})
    scheduler = make_scheduler()
    lead(scheduler)
    keeps_running(scheduler, published)
    assert published.count("garbled") == 0
    errors = lines_naming(caplog, "garbled")
    assert len(errors) == 1 and field in errors[0], caplog.text
    assert periodic_task("garbled").enabled, "the row is the operator's: left as it is"
    no_step_down(caplog)


def test_a_task_name_the_app_does_not_know_is_sent_by_name(make_scheduler, published: Published, caplog) -> None:
    """As celery beat does, an unregistered task is sent by name (a warning says so, once); the rest run."""
    interval_task("good", 1)
    interval_task("ghost", 1, task="jobs.no_such_task")
    scheduler = make_scheduler()

    def cleanup_messages() -> None:
        """Stands in for the example project's task of that name."""

    scheduler.app.task(name="jobs.cleanup_messages", shared=False)(cleanup_messages)
    lead(scheduler)
    keeps_running(scheduler, published)
    assert published.count("ghost") >= 2
    warnings = lines_naming(caplog, "ghost", logging.WARNING)
    assert len(warnings) == 1 and "jobs.no_such_task" in warnings[0], caplog.text
    assert lines_naming(caplog, "'good'", logging.WARNING) == []
    no_step_down(caplog)


# -- rows that fail django-celery-beat's checks on save ---------------------

#: Ways to make a valid 1 s interval task one that PeriodicTask.save() refuses.
SAVE_ERRORS = {
    "expires-and-expire_seconds": lambda: {"expires": _in_an_hour(), "expire_seconds": 30},
    "clocked-without-one_off": lambda: {"interval_id": None, "clocked_id": _clocked().pk, "one_off": False},
    "two-schedule-types": lambda: {"crontab_id": _crontab().pk},
}


def _in_an_hour():
    from django.utils import timezone

    return timezone.now() + timedelta(hours=1)


def _clocked():
    from django.utils import timezone
    from django_celery_beat.models import ClockedSchedule

    return ClockedSchedule.objects.create(clocked_time=timezone.now() - timedelta(seconds=1))  # due now


def _crontab():
    from django_celery_beat.models import CrontabSchedule

    return CrontabSchedule.objects.create(minute="*")


@pytest.mark.parametrize("kind", sorted(SAVE_ERRORS))
def test_a_row_that_fails_the_model_checks_is_left_out(make_scheduler, published: Published, caplog, kind: str) -> None:
    """A row PeriodicTask.save() would refuse is left out with one error naming it; the good row's run times land."""
    interval_task("good", 1)
    bad = interval_task("invalid", 1)
    write_around_the_admin("periodictask", bad.pk, **SAVE_ERRORS[kind]())
    scheduler = make_scheduler()
    lead(scheduler)
    keeps_running(scheduler, published)
    assert published.count("invalid") == 0
    assert len(lines_naming(caplog, "invalid")) == 1, caplog.text
    assert periodic_task("good").last_run_at is not None, "the good row's run times reach the database"
    no_step_down(caplog)


@pytest.mark.parametrize("kind", sorted(SAVE_ERRORS))
def test_a_row_that_turns_invalid_while_loaded_is_left_out_and_every_run_time_written(
    make_scheduler, published: Published, caplog, monkeypatch, kind: str
) -> None:
    """A row turned invalid around the admin is left out by the next full read; every row's run times are written."""
    import zkbeat.contrib.django

    interval_task("good", 1)
    interval_task("also-good", 1)
    victim = interval_task("invalid", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("invalid") >= 2 and published.count("also-good") >= 2)
    synced = {name: periodic_task(name).last_run_at for name in ("good", "also-good")}
    write_around_the_admin("periodictask", victim.pk, **SAVE_ERRORS[kind]())
    # Raw SQL moves neither date_changed nor the change marker: the full read
    # (every FULL_RELOAD_INTERVAL) is what finds it, after a sync of all three.
    monkeypatch.setattr(zkbeat.contrib.django, "FULL_RELOAD_INTERVAL", 0)
    keeps_running(scheduler, published)
    for name, before in synced.items():
        after = periodic_task(name).last_run_at
        assert after is not None and (before is None or after > before), f"{name}'s run times were lost"
    assert len(lines_naming(caplog, "invalid")) == 1, caplog.text
    assert "invalid" not in scheduler.schedule
    no_step_down(caplog)


# -- an entry whose is_due raises (the core's part) --------------------------


def test_a_row_whose_is_due_raises_is_logged_once_and_left_out(
    make_scheduler, published: Published, caplog, settings_tz_naive
) -> None:
    """A row whose is_due compares naive and aware times is logged once; the good task keeps running."""
    interval_task("good", 1)
    interval_task("naive", 1, expires=_in_an_hour())  # now (naive) >= expires (aware) raises TypeError
    scheduler = make_scheduler()
    lead(scheduler)
    keeps_running(scheduler, published)
    assert published.count("naive") == 0
    assert len(lines_naming(caplog, "naive")) == 1, caplog.text
    no_step_down(caplog)


@pytest.fixture
def settings_tz_naive():
    """django-celery-beat's naive clock (DJANGO_CELERY_BEAT_TZ_AWARE = False) over aware rows."""
    from django.test import override_settings

    with override_settings(DJANGO_CELERY_BEAT_TZ_AWARE=False):
        yield


# -- real celery beat processes ------------------------------------------------


@pytest.mark.processes
def test_three_beat_replicas_run_on_past_crontabs_with_an_unknown_time_zone(make_cluster) -> None:
    """Three `celery beat` replicas, crontab rows with unknown zones: the good task runs, one leader throughout."""
    from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks

    interval_task("good", 1)
    every_minute = CrontabSchedule.objects.create(minute="*")
    PeriodicTask.objects.create(name="on-mars", task="jobs.cleanup_messages", crontab=every_minute)
    unused = CrontabSchedule.objects.create(minute="0", hour="4")
    for crontab in (every_minute, unused):
        write_around_the_admin("crontabschedule", crontab.pk, timezone=UNKNOWN_ZONE)
    cluster = make_cluster(3).start()
    wait_for(lambda: len(cluster.publishes("good")) >= 4, timeout=60, message=cluster.logs)
    PeriodicTasks.update_changed()  # an admin edit: the leader syncs and reads every row again
    start = len(cluster.publishes("good"))
    wait_for(lambda: len(cluster.publishes("good")) >= start + 4, timeout=30, message=cluster.logs)

    logs = [replica.log() for replica in cluster.replicas]
    assert len(leader_epochs(logs)) == 1, cluster.logs()
    assert not any("unexpected error" in log for log in logs), cluster.logs()
    assert cluster.publishes("on-mars") == []
    assert len({p.pid for p in cluster.publishes("good")}) == 1
    naming = [line for log in logs for line in log.splitlines() if "'on-mars'" in line]
    assert len(naming) == 1 and UNKNOWN_ZONE in naming[0], cluster.logs()
    unused_lines = [line for log in logs for line in log.splitlines() if f"#{unused.pk} " in line]
    assert len(unused_lines) == 1, cluster.logs()
