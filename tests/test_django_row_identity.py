"""zkbeat.DatabaseScheduler when a row's identity moves under a leader: a row renamed while it holds it.

The ledger knows a task by its name; a row renamed in the admin is the same
row (the same id) under a new name, with the run it just had. A leader that
ran it keeps that run for it under its new name, rather than going back to
the run the row's ``last_run_at`` holds (written every few minutes at most).
Real PostgreSQL, ZooKeeper and Redis, the leader in this process.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.support.djangosupport import ON_THE_DATABASE, interval_task, one_off_task, pump
from tests.support.helpers import Published, connected, lead

pytestmark = ON_THE_DATABASE


def test_a_row_renamed_after_it_ran_does_not_run_again_under_its_new_name(make_scheduler, published: Published) -> None:
    """An hourly row that just ran, renamed in the admin: it runs next an hour after that run, not at once."""
    from django.utils import timezone

    interval_task("heartbeat", 1)
    hourly = interval_task("hourly", 3600, last_run_at=timezone.now() - timedelta(hours=1, seconds=1))
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("hourly") == 1)
    assert "hourly" in scheduler._dirty, "its run is not written to the row yet"

    hourly.refresh_from_db()
    hourly.name = "hourly-renamed"
    hourly.save()
    pump(scheduler, lambda: "hourly-renamed" in scheduler.schedule)
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 3)
    assert published.count("hourly-renamed") == 0, published.rows

    scheduler.sync()
    from django_celery_beat.models import PeriodicTask

    assert PeriodicTask.objects.get(name="hourly-renamed").last_run_at >= published_at(published, "hourly")


def test_a_row_renamed_into_this_replicas_part_takes_its_run_from_the_ledger(
    make_scheduler, published: Published
) -> None:
    """A row another leader ran and has not written back (it died), renamed into what this leader builds (a shard
    of its own: here a filter on names): its run under the old name is the ledger's, and it does not run again."""
    from django.utils import timezone

    interval_task("heartbeat", 1)
    hourly = interval_task("hourly", 3600, last_run_at=timezone.now() - timedelta(hours=1, seconds=1))
    first = make_scheduler(identity="first")
    lead(first)
    pump(first, lambda: published.count("hourly") == 1)
    first._dirty.clear()  # it dies before writing the run to the row
    second = make_scheduler(identity="second")
    second._table.wanted = lambda name: name != "hourly"  # marks the row under its old name, never builds it
    first.close()
    lead(second, timeout=30)
    pump(second, lambda: published.count("heartbeat") >= 2 and "hourly" not in second.schedule)

    hourly.refresh_from_db()
    assert hourly.last_run_at < published_at(published, "hourly"), "the row does not hold the run"
    hourly.name = "hourly-renamed"
    hourly.save()
    pump(second, lambda: "hourly-renamed" in second.schedule)
    beats = published.count("heartbeat")
    pump(second, lambda: published.count("heartbeat") >= beats + 3)
    assert published.count("hourly-renamed") == 0, published.rows


def published_at(published: Published, name: str):
    """The slot of ``name``'s first publish."""
    from datetime import datetime

    return datetime.fromisoformat(published.of(name)[0][1])


def test_a_one_off_deleted_as_it_runs_stays_deleted(make_scheduler, published: Published) -> None:
    """An operator deletes a one-off in the moment its leader sends it: the leader, disabling the one-off it ran,
    must not write the row back (a save() of its copy of a row that is gone inserts it again)."""
    from celery.signals import after_task_publish
    from django_celery_beat.models import PeriodicTask

    interval_task("heartbeat", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("heartbeat") >= 1)
    deleted = []

    def delete_it(headers=None, **kwargs) -> None:
        if (headers or {}).get("zkbeat-entry") == "launch" and not deleted:
            deleted.append(PeriodicTask.objects.get(name="launch").delete())

    with connected(after_task_publish, delete_it):
        one_off_task("launch")
        pump(scheduler, lambda: published.count("launch") == 1)
    assert deleted
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 2)
    assert list(PeriodicTask.objects.filter(name="launch").values_list("name", "enabled")) == []
    assert published.count("launch") == 1


def test_a_task_enabled_again_does_not_run_the_ticks_it_missed_while_disabled(
    make_scheduler, published: Published
) -> None:
    """Disabled in the admin (save(): its last_run_at cleared), then enabled again: the ticks that fell while it
    was disabled are not run (the operator turned it off for them); it goes on from the moment it was enabled, as
    with django-celery-beat alone."""
    from django_celery_beat.models import PeriodicTask

    interval_task("heartbeat", 1)
    report = interval_task("report", 2)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("report") >= 2)
    scheduler.sync()  # as every few minutes: the row holds a run and its count
    report.refresh_from_db()
    assert report.total_run_count >= 2
    report.enabled = False
    report.save()
    pump(scheduler, lambda: "report" not in scheduler.schedule)
    runs = published.count("report")
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 4)  # a tick or two of its falls meanwhile
    assert published.count("report") == runs

    report.refresh_from_db()
    report.enabled = True
    report.save()
    enabled_at = PeriodicTask.objects.get(name="report").date_changed
    pump(scheduler, lambda: published.count("report") > runs)
    slot = datetime.fromisoformat(published.of("report")[runs][1])
    assert slot > enabled_at, f"ran a tick it missed while disabled: slot {slot}, enabled again at {enabled_at}"


def test_run_times_go_only_to_rows_still_enabled_and_leave_date_changed(make_scheduler, published: Published) -> None:
    """docs/django.md: run times are written "only to rows still enabled, without save(): date_changed stays the
    time of the operator's last edit". A row disabled in the admin after it ran keeps its cleared last_run_at (what
    tells, when it is enabled again, that it goes on from then)."""
    from django_celery_beat.models import PeriodicTask

    interval_task("heartbeat", 1)
    report = interval_task("report", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("report") >= 2 and {"report", "heartbeat"} <= scheduler._dirty)
    edited = PeriodicTask.objects.get(name="heartbeat").date_changed
    report.refresh_from_db()
    report.enabled = False
    report.save()
    scheduler.sync()  # before the leader read the disable: it still holds the row's run
    assert PeriodicTask.objects.get(name="report").last_run_at is None
    heartbeat = PeriodicTask.objects.get(name="heartbeat")
    assert heartbeat.last_run_at is not None and heartbeat.total_run_count >= 1
    assert heartbeat.date_changed == edited
