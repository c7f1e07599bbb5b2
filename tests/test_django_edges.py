"""zkbeat.DatabaseScheduler at the edges of a row's identity: an edit the leader sees only half of, rows whose
times come from an admin host whose clock is off, rows that trade names, a paused row renamed; and rows the
database will not update, or that have no name.

The ledger knows a task by its name and by a clock (its last run); the database knows a row by its id, stamped
with the admin host's clock (``date_changed``). Most tests here are a case where the two disagree. Real
PostgreSQL, ZooKeeper and Redis; the leader in this process unless the test kills one.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.djangosupport import ON_THE_DATABASE, DjangoCluster, interval_task, one_off_task, periodic_task, pump
from tests.support.helpers import LogRecords, Published, lead, wait_for
from tests.support.processes import SESSION

pytestmark = ON_THE_DATABASE

#: How far off the admin host's clock is in the skew tests: far more than any run is apart from another here.
SKEW = timedelta(minutes=10)


@contextlib.contextmanager
def admin_clock(offset: timedelta) -> Iterator[None]:
    """Rows saved in the block are stamped by a clock ``offset`` off this host's (``date_changed``: Django's now)."""
    from django.utils import timezone

    real = timezone.now
    timezone.now = lambda: real() + offset
    try:
        yield
    finally:
        timezone.now = real


def slots(published: Published, name: str) -> list[str]:
    return [slot for _, slot, _ in published.of(name)]


def by_task(published: Published, task: str) -> list[tuple[str, str]]:
    """(entry, slot) of every message of ``task``, in publish order."""
    return [(h.get("zkbeat-entry"), h.get("zkbeat-slot")) for h in published.headers if h.get("task") == task]


def test_a_row_disabled_and_enabled_again_between_two_reads_goes_on_from_then(
    make_scheduler, published: Published
) -> None:
    """Disabled and enabled again in the admin (save() both times) between two of the leader's reads: it never
    sees the row disabled, only a changed row without a last run. It goes on from when it was enabled, as after a
    disable it saw (tests/test_django_row_identity.py): the ticks that fell before are not caught up, nothing is
    published twice, and it runs again."""
    from django.utils import timezone

    interval_task("heartbeat", 1)
    report = interval_task("report", 2)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("report") >= 2)
    scheduler.sync()
    report.refresh_from_db()
    assert report.total_run_count >= 1
    runs = published.count("report")
    last = datetime.fromisoformat(slots(published, "report")[-1])
    # The leader reads the tables only in its passes: none runs while two of report's ticks fall due.
    wait_for(lambda: timezone.now() > last + timedelta(seconds=5), timeout=15)

    report.enabled = False
    report.save()  # clears last_run_at, keeps the count
    report.enabled = True
    report.save()
    enabled_at = periodic_task("report").date_changed
    assert periodic_task("report").last_run_at is None

    pump(scheduler, lambda: published.count("report") >= runs + 2)
    after = [datetime.fromisoformat(slot) for slot in slots(published, "report")[runs:]]
    assert after[0] > enabled_at, f"caught up a slot from before it was enabled again: {after[0]} <= {enabled_at}"
    assert len(set(slots(published, "report"))) == published.count("report"), "a slot of report went out twice"
    assert published.count("heartbeat") >= 3


def test_a_one_off_created_again_on_an_admin_host_whose_clock_is_behind_runs(
    make_scheduler, published: Published
) -> None:
    """A one-off ran; the operator deletes it and creates it again under the same name, on an admin host whose
    clock is behind the beat host's: the new row runs once. Its date_changed is older than the ledger's run of
    its namesake, which must not make the leader take that run (and disable the new row unrun)."""
    from django_celery_beat.models import PeriodicTask

    interval_task("heartbeat", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    one_off_task("launch")
    pump(scheduler, lambda: published.count("launch") == 1 and not periodic_task("launch").enabled)

    PeriodicTask.objects.filter(name="launch").delete()
    with admin_clock(-SKEW):
        one_off_task("launch")
    pump(scheduler, lambda: published.count("launch") == 2, message=lambda: f"not run again: {published.rows}")
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 2 and not periodic_task("launch").enabled)
    assert published.count("launch") == 2


def test_a_one_off_reenabled_on_an_admin_host_whose_clock_is_behind_runs_again(
    make_scheduler, published: Published
) -> None:
    """A one-off ran and was disabled; the operator enables it again from an admin host whose clock is behind:
    it runs once more (docs/django.md), whatever that clock says."""
    interval_task("heartbeat", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    one_off_task("launch")
    pump(scheduler, lambda: published.count("launch") == 1 and not periodic_task("launch").enabled)

    row = periodic_task("launch")
    row.enabled = True
    with admin_clock(-SKEW):
        row.save()
    pump(scheduler, lambda: published.count("launch") == 2, message=lambda: f"not run again: {published.rows}")
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 2 and not periodic_task("launch").enabled)
    assert published.count("launch") == 2


def test_a_one_off_saved_ahead_of_the_beat_hosts_clock_is_not_run_again_after_its_leader_dies(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-off saved on an admin host whose clock is a few seconds ahead, sent at once; its leader dies before
    it disables the row or writes its run to it. Its successor takes over once that stamp is in the past (no
    longer a time "in the future" it would distrust): the ledger's run is of this very row, unchanged since, so
    it disables the row; it does not run it again because the row's date_changed is later than that run."""
    from django.utils import timezone

    from zkbeat.contrib.django import DatabaseScheduler
    from zkbeat.ledger import clock

    interval_task("heartbeat", 1)
    first = make_scheduler(identity="first")
    lead(first)
    pump(first, lambda: published.count("heartbeat") >= 1)
    monkeypatch.setattr(first, "after_leader_pass", lambda interval: interval)  # dies before it disables the row
    at = timezone.now()
    with admin_clock(timedelta(seconds=4)):
        one_off_task("launch", at=at)
    stamped = periodic_task("launch").date_changed
    pump(first, lambda: published.count("launch") == 1)
    sent = datetime.fromisoformat(published.of("launch")[0][1])
    assert sent < stamped, "sent before the admin host's stamp (else this is no skew)"
    first._dirty.clear()  # nor does it write the run to the row
    first.close()
    row = periodic_task("launch")
    assert row.enabled and row.total_run_count == 0

    wait_for(lambda: timezone.now() > stamped + timedelta(seconds=clock.LEDGER_TOLERANCE), timeout=15)
    second = make_scheduler(identity="second")
    assert isinstance(second, DatabaseScheduler)
    lead(second, timeout=30)
    beats = published.count("heartbeat")
    pump(second, lambda: published.count("heartbeat") >= beats + 3 and not periodic_task("launch").enabled)
    assert published.count("launch") == 1, published.rows


@pytest.mark.processes
def test_a_one_off_from_an_admin_clock_ahead_runs_once_although_its_leader_is_killed_right_after_publishing_it(
    make_cluster: Callable[..., DjangoCluster], zk_client: KazooClient
) -> None:
    """A one-off saved on an admin host whose clock is ahead, its leader SIGKILLed the moment it sent it (celery
    beat processes): the heir finds the run in the ledger and disables the row, although its date_changed is
    later than that run; it goes out once."""
    from django.utils import timezone

    interval_task("canary", 1)
    name = "launch"
    cluster = make_cluster(2, extra_env={"ZKBEAT_TEST_KILL_AFTER": name}).start()
    wait_for(lambda: len(cluster.publishes("canary")) >= 3, timeout=40, message=cluster.logs)
    at = timezone.now()
    with admin_clock(SKEW):
        one_off_task(name, at=at)
    sent = wait_for(lambda: cluster.publishes(name), timeout=20, message=cluster.logs)[0]
    doomed = cluster.replica(sent.pid)
    doomed.wait()

    wait_for(lambda: not periodic_task(name).enabled, timeout=SESSION + 20, message=cluster.logs)
    heir = next(r for r in cluster.replicas if r is not doomed)
    wait_for(lambda: len([p for p in cluster.publishes("canary") if p.pid == heir.pid]) >= 3, timeout=20,
             message=cluster.logs)  # fmt: skip
    assert len(cluster.publishes(name)) == 1, cluster.logs()
    assert heir.alive, "the heir would have killed itself had it published the one-off again"
    assert_clean(accounting(cluster, zk_client, intervals={"canary": 1}, kills=[(doomed.pid, sent.at)]), cluster.logs())


def test_two_rows_that_swap_names_keep_their_own_runs(make_scheduler, published: Published) -> None:
    """Two rows trade names in one transaction: each goes on from its own last run, not from the run the ledger
    holds under its new name (the other row's). The hourly row, due in a few seconds, runs then; it does not take
    the every-second row's run of a moment ago (and wait an hour)."""
    from django.db import transaction
    from django.utils import timezone

    fast = interval_task("a", 1, task="jobs.cleanup_messages")
    slow = interval_task(
        "b", 3600, task="jobs.aggregate_analytics", last_run_at=timezone.now() - timedelta(seconds=3600 - 6)
    )
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("a") >= 2 and "b" in scheduler.schedule)
    assert by_task(published, "jobs.aggregate_analytics") == [], "the hourly row is not due yet"

    with transaction.atomic():
        fast.refresh_from_db()
        slow.refresh_from_db()
        fast.name = "swapping"
        fast.save()
        slow.name = "a"
        slow.save()
        fast.name = "b"
        fast.save()
    pump(
        scheduler,
        lambda: by_task(published, "jobs.aggregate_analytics"),
        message=lambda: f"the hourly row did not run when due: {published.rows}",
    )
    assert [entry for entry, _ in by_task(published, "jobs.aggregate_analytics")] == ["a"]
    fast_runs = by_task(published, "jobs.cleanup_messages")
    pump(scheduler, lambda: len(by_task(published, "jobs.cleanup_messages")) >= len(fast_runs) + 2)
    fast_runs = by_task(published, "jobs.cleanup_messages")
    assert len(set(fast_runs)) == len(fast_runs), "a tick of the every-second row went out twice"
    assert fast_runs[-1][0] == "b"
    assert len(by_task(published, "jobs.aggregate_analytics")) == 1


def test_a_paused_row_renamed_keeps_running_under_its_new_name_and_says_so(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str
) -> None:
    """A pause belongs to the task's name (zkbeat.ledger.controls; docs/operating.md): a paused row renamed in
    the admin runs under its new name, the pause stays with the old name, and the leader says so in a warning
    that names both, so that an operator who meant to hold the row knows to pause the new name."""
    from zkbeat.ledger.controls import pause
    from zkbeat.ledger.store import Ledger

    interval_task("heartbeat", 1)
    held = interval_task("held", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: published.count("held") >= 1)
    pause(zk_client, zk_root, "held", by="ops", note="migration", force=True)
    runs = published.count("held")
    beats = published.count("heartbeat")
    pump(scheduler, lambda: published.count("heartbeat") >= beats + 3)
    assert published.count("held") == runs, "published while paused"

    records = LogRecords()
    logger = logging.getLogger("zkbeat.contrib.django")
    logger.addHandler(records)
    try:
        held.refresh_from_db()
        held.name = "held-renamed"
        held.save()
        pump(scheduler, lambda: published.count("held-renamed") >= 1)
    finally:
        logger.removeHandler(records)
    said = [r.getMessage() for r in records.records if r.levelno == logging.WARNING and "paused" in r.getMessage()]
    assert len(said) == 1 and "'held'" in said[0] and "'held-renamed'" in said[0], said
    assert Ledger(zk_client, zk_root).load(["held"])["held"].state.paused is not None
    assert published.count("held") == runs


@contextlib.contextmanager
def refused_updates(name: str) -> Iterator[None]:
    """The database refuses every UPDATE of row ``name`` (a CHECK added NOT VALID that the row breaks)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE django_celery_beat_periodictask ADD CONSTRAINT zkbeat_test_refused "
            "CHECK (name <> %s) NOT VALID",
            [name],
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_celery_beat_periodictask DROP CONSTRAINT zkbeat_test_refused")


def test_a_row_the_database_refuses_to_update_leaves_every_other_rows_run_times_written(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """One row the database will not update (a constraint added NOT VALID that it breaks, a trigger): the other
    rows' run times are still written at each sync, not refused with it in one statement on every sync; the
    refused row is named once in the log."""
    from tests.support.djangosupport import run_times

    interval_task("good", 1)
    interval_task("also-good", 1)
    interval_task("refused", 1)
    scheduler = make_scheduler()
    lead(scheduler)
    with refused_updates("refused"):
        pump(scheduler, lambda: {"good", "also-good", "refused"} <= scheduler._dirty)
        scheduler.sync()
        for name in ("good", "also-good"):
            last_run_at, count = run_times(name)
            assert last_run_at is not None and count >= 1, f"{name}'s run times were not written"
        assert run_times("refused") == (None, 0)
        assert {"good", "also-good"}.isdisjoint(scheduler._dirty)
        written = run_times("good")
        pump(scheduler, lambda: {"good", "refused"} <= scheduler._dirty)
        scheduler.sync()  # again: the refused row alone, the others together
        assert run_times("good") > written
        assert run_times("refused") == (None, 0)
    said = [r for r in caplog.records if r.levelno >= logging.ERROR and "'refused'" in r.getMessage()]
    assert len(said) == 1, caplog.text
    pump(scheduler, lambda: "refused" in scheduler._dirty)  # its next run
    scheduler.sync()  # the row is writable again: its run times are written, and it is no longer set apart
    assert run_times("refused")[1] >= 1
    assert not scheduler._refused_rows


def leader_counting_writes(make_scheduler, monkeypatch: pytest.MonkeyPatch, names: list[str]) -> tuple[Any, list[int]]:
    """A leading DatabaseScheduler of a row every second for each name, and the rows in each run-time write it makes.

    The loop's own sync waits beat's sync_every (3 min) from here: the rows may come dirty over several passes,
    and the first of them would sync only those. The sync each test makes is of every row.
    """
    import zkbeat.contrib.django as django_module

    for name in names:
        interval_task(name, 1)
    scheduler = make_scheduler()
    lead(scheduler)
    scheduler._last_sync = time.monotonic()
    statements: list[int] = []
    write = django_module.write_run_times

    def counting(model, runs, *args, **kwargs):
        statements.append(len(runs))
        return write(model, runs, *args, **kwargs)

    monkeypatch.setattr(django_module, "write_run_times", counting)
    return scheduler, statements


def test_one_refused_row_among_many_is_found_in_a_few_statements_not_one_a_row(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement that one refused row fails is written again in halves, down to that row: a sync of a
    minute's thousands of rows after a constraint the row breaks takes a few statements more, not one per row
    (on beat's loop, which the watchdog times)."""
    from tests.support.djangosupport import run_times

    names = [f"row-{i:02d}" for i in range(64)]
    scheduler, statements = leader_counting_writes(make_scheduler, monkeypatch, [*names, "refused"])
    with refused_updates("refused"):
        pump(scheduler, lambda: {*names, "refused"} <= scheduler._dirty)
        scheduler.sync()
        assert all(run_times(name)[1] >= 1 for name in names), "every other row's run times are written"
        assert run_times("refused") == (None, 0)
        assert scheduler._refused_rows and len(scheduler._refused_rows) == 1
    assert len(statements) <= 2 * 7 + 1, f"{len(statements)} statements for 65 rows: {statements}"


@contextlib.contextmanager
def refused_writes() -> Iterator[None]:
    """The database refuses every UPDATE of the table, whatever the row (a trigger that raises; as a read-only
    database refuses, under an error class that is not a connection's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION zkbeat_test_refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'read only'; END $$ "
            "LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER zkbeat_test_refuse BEFORE UPDATE ON django_celery_beat_periodictask "
            "FOR EACH ROW EXECUTE FUNCTION zkbeat_test_refuse()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER zkbeat_test_refuse ON django_celery_beat_periodictask")
            cursor.execute("DROP FUNCTION zkbeat_test_refuse()")


def test_a_refusal_of_every_row_is_retried_at_the_next_sync_not_split_row_by_row(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a row's own fault (a constraint it breaks, a value it cannot hold) is looked for by halving: a refusal
    of the whole write (a read-only database, a trigger, a revoked grant) splitting down to every row would cost two
    statements and a log line a row, on beat's loop, and set every row apart. It is one statement, retried at the
    next sync with every row still to write."""
    from tests.support.djangosupport import run_times

    names = [f"row-{i:02d}" for i in range(16)]
    scheduler, statements = leader_counting_writes(make_scheduler, monkeypatch, names)
    with refused_writes():
        pump(scheduler, lambda: set(names) <= scheduler._dirty)
        scheduler.sync()
        assert statements == [len(names)], statements
        assert set(names) <= scheduler._dirty, "every row is still to write"
        assert not scheduler._refused_rows
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "run times" in r.getMessage()]
    assert len(errors) == 1, caplog.text
    scheduler.sync()  # the database takes writes again: every row's run times are written
    assert all(run_times(name)[1] >= 1 for name in names)


def test_a_row_with_an_empty_name_is_left_out_and_the_rest_run(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A row named "" (raw SQL: the admin requires a name) cannot have a ledger entry: it is logged once and left
    out, and every other row runs, on the leader and on the next one."""
    from django.db import connection

    interval_task("good", 1)
    nameless = interval_task("nameless", 1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE django_celery_beat_periodictask SET name = '' WHERE id = %s", [nameless.pk])
    first = make_scheduler(identity="first")
    lead(first)
    pump(first, lambda: published.count("good") >= 3)
    first.close()
    second = make_scheduler(identity="second")
    lead(second, timeout=30)
    beats = published.count("good")
    pump(second, lambda: published.count("good") >= beats + 3)
    assert published.count("") == 0
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "''" in r.getMessage()]
    assert 1 <= len(said) <= 2, caplog.text  # once per leader
