"""zkbeat.DatabaseScheduler in-process on real PostgreSQL, ZooKeeper and Redis.

The schedule is changed through the ORM, as the Django admin changes it, and
the tests count what reached the broker (``after_task_publish``), what the
rows say, and which SQL each replica sent.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime, timedelta
from importlib import metadata

from celery import schedules
from kazoo.client import KazooClient

from tests.support.djangosupport import (
    EXAMPLE_PROJECT,
    ON_THE_DATABASE,
    capture_sql,
    interval_task,
    one_off_task,
    periodic_task,
    pump,
)
from tests.support.helpers import Published, lead, wait_for
from tests.support.messages import queued_messages
from tests.support.processes import ROOT
from tests.support.servers import RedisServer
from zkbeat.coordination.election import LeaderElection

pytestmark = ON_THE_DATABASE

#: django-celery-beat 2.8.0 disables an expired task in is_due (before, it sends it with its
#: past ``expires``, which the worker discards) and names the task in a ``periodic_task_name``
#: header (before, a message option). zkbeat keeps whichever rules its host has.
HOST_2_8 = tuple(int(p) for p in metadata.version("django-celery-beat").split(".")[:2]) >= (2, 8)


def crash(scheduler) -> None:
    """End a replica's ZooKeeper session as a crash would; it runs no more code of its own."""
    scheduler.zk_client.stop()


def test_importing_zkbeat_does_not_import_django() -> None:
    """`import zkbeat` loads neither Django's settings and ORM nor django-celery-beat; the attribute loads them."""
    # (kombu itself imports django.utils when Django is installed; that loads no settings.)
    code = (
        "import sys, zkbeat\n"
        "loaded = {'django.conf', 'django.db', 'django_celery_beat', 'zkbeat.contrib.django'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        "import django; django.setup()\n"
        "from zkbeat.contrib.django import DatabaseScheduler\n"
        "assert zkbeat.DatabaseScheduler is DatabaseScheduler\n"
        "print('ok')\n"
    )
    env = {"DJANGO_SETTINGS_MODULE": "proj.settings", "PYTHONPATH": f"{ROOT}:{EXAMPLE_PROJECT}", "PATH": "/usr/bin"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_a_follower_sends_no_query_and_upserts_beat_schedule_once_it_leads(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """While another replica leads, starting, ticking and closing send no SQL; leading, it upserts beat_schedule."""
    from django_celery_beat.models import PeriodicTask

    holder = LeaderElection(zk_client, f"{zk_root}/v1/election", {"identity": "holder"})
    holder.start()
    assert holder.wait_for_leadership(timeout=10)
    with capture_sql() as queries:
        follower = make_scheduler({"from-settings": {"task": "jobs.cleanup_messages", "schedule": 1.0}})
        wait_for(lambda: follower.election.candidate is not None, timeout=10)
        for _ in range(3):
            assert follower.tick() == 0
        follower.sync()
    assert list(queries) == []
    assert not PeriodicTask.objects.filter(name="from-settings").exists()

    holder.close()
    lead(follower)
    pump(follower, lambda: published.count("from-settings") >= 1)
    assert periodic_task("from-settings").task == "jobs.cleanup_messages"


def test_a_new_leader_publishes_first_then_upserts_beat_schedule_before_it_waits(
    make_scheduler, published: Published
) -> None:
    """The takeover's first pass publishes what is due before any write; beat_schedule is in the tables when it ends."""
    from celery.signals import after_task_publish
    from django.utils import timezone

    interval_task("due", 60, last_run_at=timezone.now() - timedelta(seconds=61))
    scheduler = make_scheduler(
        {"from-settings": {"task": "jobs.cleanup_messages", "schedule": 3600.0}}, beat_max_loop_interval=30
    )
    lead(scheduler)
    with capture_sql() as queries:
        sent_after: list[int] = []

        def note(**kwargs) -> None:
            sent_after.append(len(queries))

        after_task_publish.connect(note, weak=False)
        try:
            scheduler.tick()  # the first pass as leader; with nothing else due it would wait 30 s
        finally:
            after_task_publish.disconnect(note)
    assert published.count("due") == 1
    assert periodic_task("from-settings").task == "jobs.cleanup_messages", "upserted before the loop waits"
    writes = [i for i, sql in enumerate(queries) if sql in queries.writes()]
    assert writes and sent_after and sent_after[0] <= writes[0], "a write came before the first publish"


def test_the_leader_runs_each_kind_of_task_with_its_options(
    make_scheduler, published: Published, redis_server: RedisServer
) -> None:
    """Interval, crontab, solar and clocked one-off tasks load with options; disabled, expired, broken never run."""
    from django.utils import timezone
    from django_celery_beat.models import (
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        PeriodicTasks,
        SolarSchedule,
    )

    interval_task(
        "with-options", 1, args='["a"]', kwargs='{"k": 1}', queue="reports", priority=7,
        headers='{"tenant": "acme"}', expire_seconds=30,
    )  # fmt: skip
    hourly = CrontabSchedule.objects.create(minute="30", hour="*")
    PeriodicTask.objects.create(name="hourly", task="jobs.aggregate_analytics", crontab=hourly)
    sunset = SolarSchedule.objects.create(event="sunset", latitude=52.37, longitude=4.89)
    PeriodicTask.objects.create(name="at-sunset", task="jobs.aggregate_analytics", solar=sunset)
    one_off_task("once")
    interval_task("disabled", 1, enabled=False)
    interval_task("expired", 1, expires=timezone.now() - timedelta(minutes=1))
    fortnightly = IntervalSchedule.objects.create(every=1, period="fortnights")  # written around the admin's checks
    PeriodicTask.objects.create(name="broken", task="jobs.cleanup_messages", interval=fortnightly)

    scheduler = make_scheduler()
    lead(scheduler)
    scheduler.tick()  # becomes leader: reads the tables
    loaded = dict(scheduler.schedule)
    assert isinstance(loaded["hourly"].schedule, schedules.crontab)
    assert isinstance(loaded["at-sunset"].schedule, schedules.solar)
    # The clocked one-off was due: it ran in that first pass and was disabled right after.
    assert published.count("once") == 1 and not periodic_task("once").enabled
    assert "disabled" not in loaded and "broken" not in loaded
    pump(scheduler, lambda: published.count("with-options") >= 2 and published.count("once") == 1)
    if HOST_2_8:
        assert not periodic_task("expired").enabled, "an expired task is disabled by the leader"

    PeriodicTasks.update_changed()  # any change in the admin: the leader re-reads the rows
    pump(scheduler, lambda: not periodic_task("once").enabled)
    assert published.count("once") == 1
    assert published.count("disabled") == 0
    if HOST_2_8:
        assert published.count("expired") == 0
    else:  # as django-celery-beat's own scheduler: sent with its past expiry, which no worker runs
        expiries = [h.get("expires") for h in published.headers if h.get("zkbeat-entry") == "expired"]
        assert all(e and datetime.fromisoformat(e) < timezone.now() for e in expiries), expiries
    assert published.of("with-options")[0][2] == ["a"]

    message = next(
        m for m in queued_messages(redis_server.port, "reports*") if m["headers"].get("zkbeat-entry") == "with-options"
    )
    assert message["properties"]["priority"] == 7
    assert message["headers"]["tenant"] == "acme"
    if HOST_2_8:
        assert message["headers"]["periodic_task_name"] == "with-options"
    assert message["headers"]["expires"], "expire_seconds becomes the message's expiry"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == (["a"], {"k": 1})


def test_admin_changes_reach_the_leader_on_its_next_tick(make_scheduler, published: Published) -> None:
    """Tasks added, edited, disabled and deleted through the ORM change what the leader publishes at once."""
    first = interval_task("first", 1, args='["v1"]')
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("first") >= 1)

    second = interval_task("second", 1)
    pump(scheduler, lambda: published.count("second") >= 1)

    first.args = '["v2"]'
    first.save()
    pump(scheduler, lambda: ["v2"] in [args for _, _, args in published.of("first")])

    first.enabled = False
    first.save()
    before = published.count("first")
    second.delete()
    before_second = published.count("second")
    interval_task("third", 1)
    pump(scheduler, lambda: published.count("third") >= 3)
    assert published.count("first") == before, "a disabled task ran"
    assert published.count("second") == before_second, "a deleted task ran"
    assert set(scheduler.schedule) - {"celery.backend_cleanup"} == {"third"}


def test_a_new_leader_trusts_the_ledger_over_a_stale_database(make_scheduler, published: Published) -> None:
    """After a crash the rows' last_run_at are ticks behind; the new leader repeats none of the old leader's ticks."""
    interval_task("report", 1)
    old = make_scheduler()
    lead(old)
    pump(old, lambda: published.count("report") >= 4)
    ledger = old.ledger.load(["report"])["report"].state
    stale = periodic_task("report").last_run_at
    assert stale is not None and stale < ledger.last_run_at, "the row should lag the ledger (synced only once)"

    new = make_scheduler()
    crash(old)
    interval_task("added-meanwhile", 1)  # no leader reads the tables now: the next must find it
    lead(new)
    handover = len(published.rows)
    pump(new, lambda: published.count("report") >= 7 and published.count("added-meanwhile") >= 1)

    slots = sorted(slot for _, slot, _ in published.of("report"))
    assert len(slots) == len(set(slots)), "a tick was published twice"
    old_last = max(slot for _, slot, _ in published.of("report")[:4])
    first_new = min(slot for entry, slot, _ in published.rows[handover:] if entry == "report")
    assert first_new > old_last
    assert periodic_task("report").last_run_at >= ledger.last_run_at, "the new leader writes the ledger's times back"


def test_a_leader_that_loses_leadership_writes_nothing_more(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """Stepped down with runs not yet synced, the old leader drops them: from then on it sends no SQL at all."""
    interval_task("report", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("report") >= 3)
    stale = periodic_task("report").last_run_at
    assert stale < scheduler.ledger.load(["report"])["report"].state.last_run_at, "runs should be pending"

    heir = LeaderElection(zk_client, f"{zk_root}/v1/election", {"identity": "heir"})
    heir.start()
    wait_for(lambda: heir.candidate is not None, timeout=10)
    zk_client.delete(scheduler.election.candidate)  # what `zkbeat step-down` does
    assert heir.wait_for_leadership(timeout=10)
    wait_for(lambda: not scheduler.election.is_leader, timeout=10)
    try:
        with capture_sql() as queries:
            for _ in range(3):
                scheduler.tick()
            scheduler.close()
        assert list(queries) == []
        assert periodic_task("report").last_run_at == stale
    finally:
        heir.close()


def test_a_one_off_runs_once_when_its_leader_dies_right_after_publishing_it(
    make_scheduler, published: Published
) -> None:
    """The leader publishes a one-off and crashes before writing its row; the next leader never sends it again."""
    from celery.signals import after_task_publish

    interval_task("canary", 1)
    old = make_scheduler()
    lead(old)
    pump(old, lambda: published.count("canary") >= 2)  # past the first sync

    def crash_once_sent(headers=None, **kwargs) -> None:
        if (headers or {}).get("zkbeat-entry") == "launch":
            crash(old)  # before the pass ends, where the leader would disable the row

    after_task_publish.connect(crash_once_sent, weak=False)
    try:
        one_off_task("launch")
        pump(old, lambda: published.count("launch") == 1)
    finally:
        after_task_publish.disconnect(crash_once_sent)
    launch = periodic_task("launch")
    assert launch.enabled and launch.total_run_count == 0 and launch.last_run_at is None

    new = make_scheduler()
    lead(new)
    handover = published.count("canary")
    pump(new, lambda: not periodic_task("launch").enabled and published.count("canary") >= handover + 3)
    assert published.count("launch") == 1


def test_a_one_off_re_armed_or_re_created_by_an_operator_runs_again(make_scheduler, published: Published) -> None:
    """Run and disabled, a one-off runs once more when re-enabled (on a new leader), and so does a namesake."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTasks

    first = make_scheduler()
    lead(first)
    one_off_task("launch")
    pump(first, lambda: published.count("launch") == 1)
    PeriodicTasks.update_changed()
    pump(first, lambda: not periodic_task("launch").enabled)

    second = make_scheduler()
    first.close()  # graceful: hands over at once
    lead(second)
    launch = periodic_task("launch")
    launch.clocked = ClockedSchedule.objects.create(clocked_time=launch.clocked.clocked_time + timedelta(seconds=1))
    launch.enabled = True
    launch.save()
    pump(second, lambda: published.count("launch") == 2)
    PeriodicTasks.update_changed()
    pump(second, lambda: not periodic_task("launch").enabled)

    periodic_task("launch").delete()
    one_off_task("launch")
    pump(second, lambda: published.count("launch") == 3)
    assert len({slot for _, slot, _ in published.of("launch")}) == 3


def test_a_leader_that_stops_writes_its_last_run_times_to_the_rows(make_scheduler, published: Published) -> None:
    """close() while leading syncs the rows first (django-celery-beat's own close does): none is left behind."""
    interval_task("report", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("report") >= 3)
    ledger = scheduler.ledger.load(["report"])["report"].state
    scheduler.close()
    assert periodic_task("report").total_run_count == ledger.total_run_count
    assert periodic_task("report").last_run_at >= ledger.last_run_at


def test_a_run_now_of_a_one_off_row_leaves_its_scheduled_run(make_scheduler, published: Published) -> None:
    """`zkbeat trigger` on a one-off clocked a few seconds ahead: the manual run goes out, and so does its own."""
    from django.utils import timezone

    from zkbeat.ledger import controls

    interval_task("canary", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("canary") >= 2)
    one_off_task("launch", at=timezone.now() + timedelta(seconds=10))
    pump(scheduler, lambda: published.count("canary") >= 3)  # the leader has read the new row
    controls.request_trigger(scheduler.ledger.client, scheduler.zk_settings.root, "launch", "ops", scheduled=True)
    pump(scheduler, lambda: published.count("launch") >= 2, timeout=30, message="the one-off's own run never came")
    launches = [h for h in published.headers if h["zkbeat-entry"] == "launch"]
    assert len(launches) == 2
    assert [bool(h.get("zkbeat-manual")) for h in launches].count(True) == 1, "one run-now and the one-off's own run"
